"""Which calibrator should a CNN's ``trtqat calibrate`` use by default? PTQ top-1 per method.

For each ``--models`` entry and each seed, on scikit-learn's digits at ``--image-size``: FP32
training with the CNN family's train recipe (``--epochs`` overrides its length, to keep the
run affordable), one histogram collection over ``--calib-batches`` training batches, then
one amax per calibrator of the demo (max, percentile 99.9 / 99.99, mse, entropy) and the
fake-quant validation top-1 of each. No QAT. The same helpers as
``benchmarks/mobile_accuracy.py`` (the family's model, recipe, loop and per-channel weight
scales, as ``trtqat train`` / ``calibrate`` do).

Prints, per model, mean +- std over the seeds and each method's rank, then the methods ranked
by their mean top-1 over every (model, seed) run; writes ``--out/results.json``.

    python benchmarks/calib_default.py --threads 1                  # resnet18, mobilenet_v2
    python benchmarks/calib_default.py --models resnet18 --seeds 0 --epochs 3
    python benchmarks/calib_default.py --merge a/results.json,b/results.json  # one table
    python benchmarks/calib_default.py --formats int8,fp8   # FP8's calibrators beside INT8's
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench, mobile_accuracy

from _bench import choose_threads, parse_seeds, save_results  # noqa: E402
from mobile_accuracy import FP32_WARMUP_EPOCHS, fit, quantized_copy, recipes  # noqa: E402

import trtqat  # noqa: E402
from trtqat import families  # noqa: E402
from trtqat.families.cnn.data import make_datasets, make_loader, make_loaders  # noqa: E402
from trtqat.quant.format_apply import apply_format  # noqa: E402
from trtqat.runs import distributed as D  # noqa: E402
from trtqat.runs.loop import evaluate  # noqa: E402
from trtqat.stages.demo import CALIBRATORS  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18,mobilenet_v2",
                   help="CNN family model names, comma-separated")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-2"))
    p.add_argument("--epochs", type=int, default=None,
                   help="FP32 epochs (default: the family's recipe)")
    p.add_argument("--calib-batches", type=int, default=8)
    p.add_argument("--formats", default="int8",
                   help="quantized formats (trtqat.formats), comma-separated: each is "
                   "calibrated from the same FP32 model (fp8 skips entropy, which it refuses)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 on an idle machine, else 1)")
    p.add_argument("--out", default="runs/calib_default")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--merge", default=None, metavar="A.json,B.json",
                   help="run nothing: the table of the runs in these results files (e.g. "
                   "models measured by separate processes)")
    return p.parse_args(argv)


def label(method: str, pct: float | None) -> str:
    """``percentile 99.9`` / ``mse``: a calibrator's name in the tables."""
    return method + (f" {pct:g}" if pct is not None else "")


def run_seed(model_name: str, a: argparse.Namespace, seed: int) -> dict[str, Any]:
    """FP32 top-1 and the PTQ top-1 of every calibrator for one model and seed."""
    family = families.of_model(model_name)
    ns = SimpleNamespace(**{**vars(a), "model": model_name, "qat_epochs": None, "qat_lr": None,
                            "qat_from": "best", "lr": None, "min_lr": None, "momentum": None,
                            "weight_decay": None, "opt": None, "label_smoothing": None,
                            "batch_size": None, "weights": ("per-channel",)})
    train, _, _ = recipes(family, ns)
    D.seed_everything(seed, 0)
    batch = int(train["batch_size"])
    train_loader, val_loader, classes = make_loaders("digits", a.image_size, batch, seed=seed)
    calib_set = make_datasets("digits", a.image_size, seed, augment=False)[0]
    calib_loader = make_loader(calib_set, batch, seed=seed, train=True)
    model = family.build(model_name, classes, image_size=a.image_size)
    t = time.perf_counter()
    top1 = {"fp32": fit(model, (train_loader, val_loader), train, FP32_WARMUP_EPOCHS, "fp32",
                        a.progress)["top1"]}
    for fmt in a.formats.split(","):
        qmodel = quantized_copy(family, ns, model, classes, "per-channel")
        apply_format(qmodel, fmt)
        trtqat.collect_stats(qmodel, calib_loader, num_batches=a.calib_batches,
                             progress=a.progress)
        for method, pct in CALIBRATORS:
            if fmt == "fp8" and method == "entropy":
                continue
            trtqat.compute_amax(qmodel, method, **({"percentile": pct} if pct else {}))
            name = label(method, pct) if fmt == "int8" else f"{fmt} {label(method, pct)}"
            top1[name] = evaluate(qmodel, val_loader, progress=a.progress)["top1"]
    return {"model": model_name, "seed": seed, "epochs": train["epochs"], "top1": top1,
            "time_s": time.perf_counter() - t}


def stats(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Print mean +- std per model and method and the overall ranking; returns them."""
    methods = list(runs[0]["top1"])
    per_model: dict[str, dict[str, tuple[float, float]]] = {}
    for name in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == name]
        per_model[name] = {m: stats([r["top1"][m] for r in mine]) for m in methods}
        print(f"\n{name} ({len(mine)} seed(s), {mine[0]['epochs']} FP32 epochs): top-1 mean +- std")
        for m, (mean, std) in per_model[name].items():
            print(f"  {m:<18} {mean:6.2f} +- {std:5.2f}")
    ptq = methods[1:]
    overall = {m: stats([r["top1"][m] for r in runs]) for m in ptq}
    worst = {m: min(r["top1"][m] - r["top1"]["fp32"] for r in runs) for m in ptq}
    ranked = sorted(ptq, key=lambda m: -overall[m][0])
    print("\nevery model and seed: PTQ top-1 mean +- std, worst run vs FP32")
    for m in ranked:
        print(f"  {m:<18} {overall[m][0]:6.2f} +- {overall[m][1]:5.2f}   worst {worst[m]:+6.2f}")
    print(f"best by mean: {ranked[0]}")
    return {"per_model": per_model, "overall": overall, "worst_vs_fp32": worst,
            "ranked": ranked}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    a = parse_args(argv)
    if a.merge:
        import json

        runs = [r for f in a.merge.split(",") for r in json.loads(Path(f).read_text())["runs"]]
        table(runs)
        return 0
    a.threads, why = choose_threads(a.threads)
    torch.set_num_threads(a.threads)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    print(f"{', '.join(models)} at {a.image_size}x{a.image_size} digits, seeds "
          f"{', '.join(map(str, a.seeds))}, {a.threads} thread(s) ({why})", flush=True)
    start, runs = time.perf_counter(), []
    meta = {"config": {**vars(a), "torch": torch.__version__, "machine": platform.machine()}}
    for name in models:
        for seed in a.seeds:
            run = runs.append(run_seed(name, a, seed)) or runs[-1]
            cells = "  ".join(f"{k} {v:6.2f}" for k, v in run["top1"].items())
            print(f"{name} seed {seed}: {cells} ({run['time_s']:.0f} s)", flush=True)
            save_results(Path(a.out), {**meta, "partial": True, "runs": runs})
    summary = table(runs)
    total = time.perf_counter() - start
    print(f"total {total:.0f} s")
    save_results(Path(a.out), {**meta, "partial": False, "runs": runs, "total_s": total,
                               **summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

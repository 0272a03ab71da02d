"""Accuracy of a mobile CNN on CPU over several seeds: FP32, PTQ per calibrator, QAT INT8.

Per seed, on scikit-learn's digits (upscaled to ``--image-size``): FP32 training from
scratch with the CNN family's train recipe for ``--model``; PTQ with each calibrator of the
demo (max, percentile 99.9 / 99.99, mse, entropy: one histogram collection over
``--calib-batches`` training batches, one amax per method); QAT from the family's
calibrator with the family's QAT recipe (``family.recipe("qat", ...)``); the calibrator is
the seed's best PTQ one by validation top-1, as ``trtqat demo`` picks it (``--qat-from``
names one instead). ``--weights per-channel,per-tensor`` also quantizes the same FP32
model with one weight scale per tensor (``quantize_static``'s default in ONNX Runtime) and
reports each setting on its own. The model is
built, reloaded and quantized only through its family object and trained by the library's
loop (``trtqat.runs.loop``) with the library's optimizer and per-step cosine schedule, as
``trtqat train`` / ``calibrate`` / ``qat`` do. Top-1 is PyTorch fake-quant accuracy (the
fast proxy of the demo's ONNX Runtime engines) at the last epoch: no selection on the
validation set.

One seed's 360 validation images resolve 0.28 points, so the verdict uses the mean over
seeds, and each seed's QAT is paired with the best PTQ calibrator (best by mean top-1).
Targets (issue #25): best PTQ loses >= 1 point against FP32, QAT is within 0.5 point of
FP32 and QAT - best PTQ >= +1 point. MobileNetV2's FP32 recipe (lr 0.02, weight decay 4e-5,
``trtqat/families/cnn/train_recipes.py``) was picked over AdamW on seeds 10 and 11, so seeds
from 15 on are the held-out ones for it. Results go to ``--out/results.json``, rewritten
after every seed.

    python benchmarks/mobile_accuracy.py                         # the demo's mobile model
    python benchmarks/mobile_accuracy.py --model mobilenet_v2 --seeds 0 --epochs 5
    python benchmarks/mobile_accuracy.py --weights per-channel,per-tensor
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench

from _bench import choose_threads, parse_seeds, save_results, summarize  # noqa: E402

import trtqat  # noqa: E402
from trtqat import families  # noqa: E402
from trtqat.families.cnn.data import make_datasets, make_loader, make_loaders  # noqa: E402
from trtqat.families.cnn.models import QUANT_DESC_INPUT  # noqa: E402
from trtqat.quant.config import QuantConfig  # noqa: E402
from trtqat.quant.descriptor import QUANT_DESC_8BIT_PER_TENSOR  # noqa: E402
from trtqat.runopts import FP32_DEFAULTS  # noqa: E402
from trtqat.runs import distributed as D  # noqa: E402
from trtqat.runs import recipes as R  # noqa: E402
from trtqat.runs.loop import evaluate, train_one_epoch  # noqa: E402
from trtqat.stages.demo import CALIBRATORS  # noqa: E402

DEMO_MOBILE_MODEL = "mobilenet_v2"
MIN_PTQ_LOSS = 1.0  # points of top-1 the best PTQ calibrator loses against FP32
MAX_QAT_GAP = 0.5  # points of top-1 between QAT INT8 and FP32
MIN_QAT_GAIN = 1.0  # points of top-1 of QAT over the best PTQ calibrator
FP32_WARMUP_EPOCHS = 1.0  # `trtqat train`'s default
WEIGHTS = ("per-channel", "per-tensor")  # per-channel: what `trtqat calibrate` does
RECIPE_FIELDS = ("epochs", "lr", "min_lr", "momentum", "weight_decay", "opt", "label_smoothing",
                 "batch_size")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEMO_MOBILE_MODEL, help="a CNN family model name")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("10-14"),
                   help="seeds: a list and/or ranges (default 10-14)")
    for name in RECIPE_FIELDS:
        kind = str if name == "opt" else int if name in ("epochs", "batch_size") else float
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                       help="FP32 recipe override (default: the family's recipe)")
    p.add_argument("--qat-epochs", type=int, default=None, help="default: the QAT recipe")
    p.add_argument("--qat-lr", type=float, default=None, help="default: the QAT recipe")
    p.add_argument("--qat-from", default="best",
                   help="calibrator QAT starts from: best (the seed's best PTQ calibrator, as "
                   "`trtqat demo` picks it; default), family (the family's, as `trtqat "
                   "calibrate` uses) or a method name")
    p.add_argument("--weights", type=_weights, default=WEIGHTS[:1],
                   help="weight scales, one or both of per-channel,per-tensor (default "
                   "per-channel, as `trtqat calibrate`); each is measured on the same FP32 model")
    p.add_argument("--calib-batches", type=int, default=8)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 on an idle machine, else 1)")
    p.add_argument("--out", default="runs/mobile_accuracy")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    return p.parse_args(argv)


def _weights(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or set(names) - set(WEIGHTS):
        raise argparse.ArgumentTypeError(f"give one or both of {','.join(WEIGHTS)}")
    return names


def recipes(family: Any, a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(train recipe, QAT recipe, calibration method) of ``family`` for ``a.model``, with the
    command line's overrides, as ``trtqat train`` / ``qat`` / ``calibrate`` resolve them."""
    asked = {k: getattr(a, k) for k in RECIPE_FIELDS}
    base = SimpleNamespace(model=a.model, **asked)
    train = {**FP32_DEFAULTS, **family.recipe("train", base),
             **{k: v for k, v in asked.items() if v is not None}}
    train.update(model=a.model, image_size=a.image_size, data="digits")
    fields = ("epochs", "lr", "min_lr", "momentum", "weight_decay", "opt", "label_smoothing",
              "data", "image_size", "batch_size")
    cfg = SimpleNamespace(**{**dict.fromkeys(fields), "epochs": a.qat_epochs, "lr": a.qat_lr})
    source = {"model": {"arch": family.arch(a.model), "family": family.name},
              "train_args": train}
    qat = family.recipe("qat", cfg, source)
    method = (family.recipe("calibrate", None).get("method", "entropy")
              if a.qat_from == "family" else a.qat_from)
    return train, qat, method


def fit(model: nn.Module, loaders: tuple, r: dict[str, Any], warmup_epochs: float,
        label: str, progress: bool) -> dict[str, float]:
    """The library's optimizer and per-step cosine schedule of recipe ``r``; returns the last
    epoch's validation metrics."""
    train_loader, val_loader = loaders
    ctx = D.DistContext()
    optimizer = R.build_optimizer(r["opt"], model, r["lr"], r["momentum"], r["weight_decay"])
    steps, epochs = len(train_loader), int(r["epochs"])
    warmup = min(int(round(warmup_epochs * steps)), steps * epochs // 2)
    scheduler = R.build_scheduler(optimizer, steps * epochs, warmup,
                                  float(r["min_lr"]) / float(r["lr"]))
    criterion = nn.CrossEntropyLoss(label_smoothing=float(r["label_smoothing"]))
    va: dict[str, float] = {}
    for epoch in range(epochs):
        train_one_epoch(model, train_loader, criterion, optimizer, scheduler, ctx, epoch,
                        progress=progress, desc=label)
        va = evaluate(model, val_loader, ctx, progress=progress)
    return va


def quantized_copy(family: Any, a: argparse.Namespace, model: nn.Module, classes: int,
                   weights: str) -> nn.Module:
    """A fake-quantized copy of the FP32 ``model``. Per-channel weights: rebuilt from a
    checkpoint-like dict by the family, as the calibrate stage does; per-tensor weights:
    ``trtqat.quantize`` with the family's activation descriptor and one weight scale per
    tensor (the same placement)."""
    if weights == "per-channel":
        spec = {"family": family.name, "arch": family.arch(a.model), "num_classes": classes,
                "image_size": a.image_size, "quantized": False, "skip_layers": [],
                "source": family.origin(a.model)}
        return family.load({"model": spec, "state_dict": model.state_dict()}, quantized=True)
    qmodel = copy.deepcopy(model)
    trtqat.quantize(qmodel, QuantConfig(quant_desc_input=QUANT_DESC_INPUT,
                                        quant_desc_weight=QUANT_DESC_8BIT_PER_TENSOR))
    return qmodel


def run_seed(family: Any, a: argparse.Namespace, seed: int, train: dict[str, Any],
             qat_recipe: dict[str, Any], method: str) -> dict[str, dict[str, Any]]:
    """FP32, every PTQ calibrator and QAT of one seed, for each ``a.weights`` setting (one
    FP32 model): setting -> top-1 and loss of each."""
    D.seed_everything(seed, 0)
    batch = int(train["batch_size"])
    train_loader, val_loader, classes = make_loaders("digits", a.image_size, batch, seed=seed)
    calib_set = make_datasets("digits", a.image_size, seed, augment=False)[0]
    calib_loader = make_loader(calib_set, batch, seed=seed, train=True)
    model = family.build(a.model, classes, image_size=a.image_size)
    t = time.perf_counter()
    va = fit(model, (train_loader, val_loader), train, FP32_WARMUP_EPOCHS, "fp32", a.progress)
    fp32 = {"top1": va["top1"], "loss": va["loss"], "time": time.perf_counter() - t}
    out: dict[str, dict[str, Any]] = {}
    for weights in a.weights:
        top1, loss = {"fp32": fp32["top1"]}, {"fp32": fp32["loss"]}
        times = {"fp32": fp32["time"]}
        # PTQ: one histogram pass, then one amax per calibrator
        t = time.perf_counter()
        qmodel = quantized_copy(family, a, model, classes, weights)
        trtqat.collect_stats(qmodel, calib_loader, num_batches=a.calib_batches,
                             progress=a.progress)
        calibrators = {}
        for calib_method, pct in CALIBRATORS:
            label = f"ptq {calib_method}" + (f" {pct:g}" if pct is not None else "")
            calibrators[label] = (calib_method, pct)
            trtqat.compute_amax(qmodel, calib_method, **({"percentile": pct} if pct else {}))
            va = evaluate(qmodel, val_loader, progress=a.progress)
            top1[label], loss[label] = va["top1"], va["loss"]
        times["ptq"] = time.perf_counter() - t

        # QAT from the seed's best PTQ calibrator (the first best, as `trtqat demo` takes it)
        t = time.perf_counter()
        start = (max(calibrators, key=lambda k: top1[k]) if method == "best"
                 else next((k for k, v in calibrators.items() if v[0] == method), None))
        if start is None:
            raise SystemExit(f"--qat-from {method}: not a calibrator of the demo")
        calib_method, pct = calibrators[start]
        trtqat.compute_amax(qmodel, calib_method, **({"percentile": pct} if pct else {}))
        va = fit(qmodel, (train_loader, val_loader), qat_recipe, 0.0, "qat", a.progress)
        top1["qat"], loss["qat"] = va["top1"], va["loss"]
        times["qat"] = time.perf_counter() - t
        out[weights] = {"seed": seed, "top1": top1, "val_loss": loss, "times_s": times,
                        "qat_from": start, "val_images": len(val_loader.dataset)}
    return out


def verdict(s: dict[str, Any]) -> dict[str, bool]:
    """The three targets of issue #25 item 4 on the summary ``s``."""
    return {"ptq_loses": s["best_ptq_minus_fp32"] <= -MIN_PTQ_LOSS,
            "qat_close": s["qat_minus_fp32"] >= -MAX_QAT_GAP,
            "qat_gain": s["qat_minus_best_ptq"] >= MIN_QAT_GAIN}


def report(weights: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Print the summary of one weight setting over its seeds; returns it with the verdict."""
    s = summarize(runs)
    print(f"\n{weights} weights: {'top-1 over ' + str(len(runs)) + ' seed(s)':<24} "
          f"{'mean':>7} {'std':>6}  {'mean val loss':>13}")
    for m, st in s["stats"].items():
        print(f"{'':<21}{m:<24} {st['mean']:7.2f} {st['std']:6.2f}  "
              f"{st['mean_val_loss']:13.4f}")
    best, paired, ok = s["best_ptq"], s["paired"], verdict(s)
    mark = {True: "PASS", False: "FAIL"}
    print(f"best PTQ ({best}) - FP32 {s['best_ptq_minus_fp32']:+.2f} points "
          f"(target <= -{MIN_PTQ_LOSS}): {mark[ok['ptq_loses']]}")
    print(f"QAT - FP32 {s['qat_minus_fp32']:+.2f} points (target >= -{MAX_QAT_GAP}): "
          f"{mark[ok['qat_close']]}")
    print(f"QAT - best PTQ {s['qat_minus_best_ptq']:+.2f} points (target >= +{MIN_QAT_GAIN}): "
          f"{mark[ok['qat_gain']]}; per seed: {paired['wins']} win(s), {paired['ties']} "
          f"tie(s), {paired['losses']} loss(es)")
    return {"runs": runs, **s, "targets": ok, "targets_met": all(ok.values())}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 when the first ``--weights`` setting (per-channel: the
    demo's) meets the targets, 1 otherwise."""
    a = parse_args(argv)
    a.threads, _ = choose_threads(a.threads)
    torch.set_num_threads(a.threads)
    start = time.perf_counter()
    family = families.of_model(a.model)
    train, qat_recipe, method = recipes(family, a)
    print(f"{a.model} ({family.name} family), {a.image_size}x{a.image_size} digits, seeds "
          f"{', '.join(map(str, a.seeds))}, {a.threads} thread(s), weights "
          f"{', '.join(a.weights)}\n"
          f"FP32: {train['opt']} lr {train['lr']:g} wd {train['weight_decay']:g}, "
          f"{train['epochs']} epochs of {train['batch_size']}; QAT from {method}: "
          f"{qat_recipe['opt']} lr {qat_recipe['lr']:g} -> {qat_recipe['min_lr']:g}, "
          f"{qat_recipe['epochs']} epochs", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in a.weights}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": a.model, "family": family.name,
            "recipes": {"train": train, "qat": qat_recipe, "qat_from": method},
            "config": {**vars(a), "torch": torch.__version__,
                       "machine": platform.machine(), "cpus": os.cpu_count()}}
    for seed in a.seeds:
        for weights, run in run_seed(family, a, seed, train, qat_recipe, method).items():
            runs[weights].append(run)
            cells = "  ".join(f"{k} {v:6.2f}" for k, v in run["top1"].items())
            print(f"seed {seed:>3} {weights}: {cells}  (QAT from {run['qat_from']}; "
                  f"{sum(run['times_s'].values()):.0f} s)", flush=True)
        save_results(out, {**meta, "seeds_done": [r["seed"] for r in runs[a.weights[0]]],
                           "partial": seed != a.seeds[-1], "runs": runs})
    summaries = {w: report(w, r) for w, r in runs.items()}
    total = time.perf_counter() - start
    print(f"total {total:.0f} s")
    first = summaries[a.weights[0]]
    save_results(out, {**meta, "seeds": a.seeds, "partial": False, "total_s": total,
                       **first, "weights": summaries})
    return 0 if first["targets_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

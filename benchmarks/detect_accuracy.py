"""Accuracy of the built-in detector (``yolo_digits``) over several seeds: FP32, PTQ, QAT INT8.

Per seed, on the embedded digits detection data (96x96 canvases, 300 validation images with
their ~750 boxes): FP32 training with the family's recipe (``trtqat.stages.train_fp32``),
PTQ of its best checkpoint with each calibrator (max, percentile 99.9 / 99.99, mse,
entropy: ``trtqat.stages.calibrate``), and QAT (``trtqat.stages.qat_finetune``, the family's
recipe: 20% of the FP32 epochs at 10% of its lr, cosine to 1% of that; ``--qat-epochs`` and
``--qat-lr`` override it) from the family's
default calibration (percentile 99.99). Every figure is COCO mAP (pycocotools) on the
validation split: mAP@[.5:.95] and mAP@.5, in percent.

"Best PTQ" is the calibrator with the best mean mAP@[.5:.95] over the seeds; each seed's QAT
is paired with it (QAT - PTQ per seed, mean and spread). Targets: FP32 mAP@.5 >= 90 on every
seed, QAT mean >= best PTQ mean. Results go to ``--out/results.json``.

    python benchmarks/detect_accuracy.py                  # seeds 0-2
    python benchmarks/detect_accuracy.py --seeds 0 --epochs 2 --quick
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench

from _bench import save_results  # noqa: E402

from trtqat.runs.checkpoint import load_checkpoint  # noqa: E402
from trtqat.stages.calibrate import CalibrateConfig, calibrate  # noqa: E402
from trtqat.stages.qat import QATConfig, qat_finetune  # noqa: E402
from trtqat.stages.train import TrainConfig, train_fp32  # noqa: E402

CALIBRATORS = (("max", "max", 99.99), ("percentile 99.9", "percentile", 99.9),
               ("percentile 99.99", "percentile", 99.99), ("mse", "mse", 99.99),
               ("entropy", "entropy", 99.99))
QAT_FROM = "percentile 99.99"  # the family's default calibration


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--epochs", type=int, default=None, help="FP32 epochs (default: recipe)")
    p.add_argument("--qat-epochs", type=int, default=None, help="default: the QAT recipe")
    p.add_argument("--qat-lr", type=float, default=None, help="default: the QAT recipe")
    p.add_argument("--distill", type=float, default=None, help="QAT distillation weight")
    p.add_argument("--calib-batches", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="4 batches per epoch (a smoke run)")
    p.add_argument("--runs", default=None, help="where the run folders go (default: a temp dir)")
    p.add_argument("--reuse", action="store_true", help="take FP32 and PTQ from finished runs "
                   "in --runs (QAT only runs again, e.g. with --distill)")
    p.add_argument("--out", default=None, help="results folder (default runs/detect_accuracy/"
                   "<time>)")
    return p.parse_args(argv)


def _score(result: Any) -> dict[str, float]:
    """mAP@[.5:.95] (the stage's best) and the last record's mAP@.5."""
    best = result.best if hasattr(result, "best") else result["best_map"]
    return {"map": float(best), "map50": float((result["last"] or {}).get("val_map50", "nan"))}


def one_seed(seed: int, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """FP32, every PTQ and QAT of one seed: their mAP figures."""
    limit = 4 if args.quick else None
    common = {"seed": seed, "progress": False, "overwrite": True, "limit_batches": limit}
    t0 = time.perf_counter()
    if args.reuse:
        fp32 = {"best_map": load_checkpoint(root / "fp32" / "best.pt")["best_map"], "last": {}}
    else:
        fp32 = train_fp32(TrainConfig(model="yolo_digits", epochs=args.epochs,
                                      out=str(root / "fp32"), **common))
    out: dict[str, Any] = {"fp32": _score(fp32), "fp32_time_s": time.perf_counter() - t0,
                           "ptq": {}}
    # the best FP32 epoch's mAP@.5 (the score of best.pt)
    best = load_checkpoint(root / "fp32" / "best.pt")
    out["fp32"]["map50"] = float(best["metrics"]["val_map50"])
    for label, method, pct in CALIBRATORS:
        done = root / f"ptq-{label.replace(' ', '-')}" / "best.pt"
        if args.reuse:
            ckpt = load_checkpoint(done)
            out["ptq"][label] = {"map": float(ckpt["best_map"]),
                                 "map50": float(ckpt["metrics"]["val_map50"])}
            continue
        res = calibrate(CalibrateConfig(checkpoint=str(root / "fp32" / "best.pt"),
                                        method=method, percentile=pct,
                                        num_batches=args.calib_batches,
                                        out=str(root / f"ptq-{label.replace(' ', '-')}"),
                                        **common))
        out["ptq"][label] = _score(res)
    t1 = time.perf_counter()
    qat = qat_finetune(QATConfig(checkpoint=str(root / f"ptq-{QAT_FROM.replace(' ', '-')}"
                                               / "best.pt"), epochs=args.qat_epochs,
                                 lr=args.qat_lr,
                                 distill=args.distill,
                                 out=str(root / ("qat-distill" if args.distill else "qat")),
                                 **common))
    out["qat"] = _score(qat)
    out["qat_time_s"] = time.perf_counter() - t1
    print(f"seed {seed}: fp32 {out['fp32']}  ptq "
          f"{ {k: round(v['map'], 2) for k, v in out['ptq'].items()} }  qat {out['qat']}",
          flush=True)
    return out


def _stat(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:6.2f} +- {sd:5.2f}"


def report(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Mean +- std per variant, the best PTQ, the paired QAT - best PTQ differences."""
    seeds = sorted(per_seed)
    rows = {"fp32": [per_seed[s]["fp32"] for s in seeds]}
    for label, _, _ in CALIBRATORS:
        rows[f"ptq {label}"] = [per_seed[s]["ptq"][label] for s in seeds]
    rows["qat"] = [per_seed[s]["qat"] for s in seeds]
    print(f"\n{'variant':<22} {'mAP@[.5:.95]':>16} {'mAP@.5':>16}   (mean +- std over seeds "
          f"{','.join(map(str, seeds))})")
    for name, vals in rows.items():
        print(f"{name:<22} {_stat([v['map'] for v in vals]):>16} "
              f"{_stat([v['map50'] for v in vals]):>16}")
    best = max((k for k in rows if k.startswith("ptq")),
               key=lambda k: statistics.fmean(v["map"] for v in rows[k]))
    diffs = [q["map"] - p["map"] for q, p in zip(rows["qat"], rows[best])]
    wins = sum(d > 0 for d in diffs)
    print(f"\nbest PTQ: {best}; QAT - best PTQ per seed (mAP@[.5:.95]): "
          f"{', '.join(f'{d:+.2f}' for d in diffs)}; mean {_stat(diffs)}; QAT ahead on "
          f"{wins}/{len(diffs)} seeds")
    fp32_ok = all(v["map50"] >= 90.0 for v in rows["fp32"])
    qat_ok = statistics.fmean(diffs) >= 0
    print(f"targets: FP32 mAP@.5 >= 90 on every seed: {'met' if fp32_ok else 'NOT met'}; "
          f"QAT mean >= best PTQ mean: {'met' if qat_ok else 'NOT met'}")
    return {"rows": rows, "best_ptq": best, "qat_minus_best_ptq": diffs,
            "fp32_target_met": fp32_ok, "qat_target_met": qat_ok}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.disable(logging.INFO)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = Path(args.out or f"runs/detect_accuracy/{time.strftime('%Y%m%d-%H%M%S')}")
    with tempfile.TemporaryDirectory(prefix="detect_acc_") as tmp:
        root = Path(args.runs or tmp)
        per_seed = {s: one_seed(s, root / f"seed{s}", args) for s in seeds}
    summary = report(per_seed)
    save_results(out, {"config": vars(args), "platform": platform.platform(),
                       "torch": torch.__version__, "threads": args.threads,
                       "per_seed": per_seed, **summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())

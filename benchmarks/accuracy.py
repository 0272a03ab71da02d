"""Accuracy of the training recipes on CPU: ResNet18 at 32x32 on scikit-learn's digits.

FP32 training, PTQ with each calibration method, QAT from the best PTQ model; prints top-1 of
each, the QAT - FP32 difference and the wall time, and writes ``results.json`` (with the
configuration) into ``--out``. Targets: FP32 >= 97% top-1, QAT within 0.5 points of FP32,
all of it within 10 minutes on 2 cores.

    python benchmarks/accuracy.py --out runs/bench-accuracy
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from trtqat.quant.model_ops import AMAX_METHODS
from trtqat.stages.calibrate import CalibrateConfig, calibrate
from trtqat.stages.qat import QATConfig, qat_finetune
from trtqat.stages.train import TrainConfig, train_fp32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-batches", type=int, default=16, help="calibration batches")
    p.add_argument("--methods", default=",".join(AMAX_METHODS))
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench-accuracy")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 when the targets are met, 1 otherwise."""
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    common = {"device": "cpu", "overwrite": True, "progress": a.progress, "seed": a.seed}
    times: dict[str, float] = {}
    t_all = time.perf_counter()

    t = time.perf_counter()
    fp32 = train_fp32(TrainConfig(model=a.model, data="digits", image_size=a.image_size,
                                  epochs=a.epochs, lr=a.lr, batch_size=a.batch_size,
                                  out=str(out / "fp32"), **common))
    times["fp32"] = time.perf_counter() - t
    fp32_top1 = fp32["best_top1"]
    print(f"FP32           top-1 {fp32_top1:6.2f}%   ({times['fp32']:.0f}s)", flush=True)

    ptq: dict[str, float] = {}
    for method in a.methods.split(","):
        t = time.perf_counter()
        r = calibrate(CalibrateConfig(checkpoint=str(out / "fp32" / "best.pt"), method=method,
                                      num_batches=a.num_batches, out=str(out / f"ptq_{method}"),
                                      **common))
        times[f"ptq_{method}"] = time.perf_counter() - t
        ptq[method] = r["best_top1"]
        print(f"PTQ {method:<11}top-1 {ptq[method]:6.2f}%   ({times[f'ptq_{method}']:.0f}s)",
              flush=True)

    source = max(ptq, key=lambda m: ptq[m])  # first best, in AMAX_METHODS order
    t = time.perf_counter()
    qat = qat_finetune(QATConfig(checkpoint=str(out / f"ptq_{source}" / "best.pt"),
                                 out=str(out / "qat"), **common))
    times["qat"] = time.perf_counter() - t
    qat_top1 = qat["best_top1"]
    total = time.perf_counter() - t_all
    diff = qat_top1 - fp32_top1
    print(f"QAT (from {source}) top-1 {qat_top1:6.2f}%   ({times['qat']:.0f}s)")
    print(f"QAT - FP32    {diff:+.2f} points")
    use = resource.getrusage(resource.RUSAGE_SELF)
    cpu = use.ru_utime + use.ru_stime
    print(f"wall time     {total:.0f}s ({total / 60:.1f} min, {a.threads} thread(s)); "
          f"CPU time {cpu:.0f}s")
    ok = fp32_top1 >= 97.0 and diff >= -0.5 and total <= 600
    print("targets (FP32 >= 97%, QAT - FP32 >= -0.5, <= 10 min):", "met" if ok else "NOT met")
    results = {"config": vars(a), "fp32_top1": fp32_top1, "ptq_top1": ptq,
               "qat_source": source, "qat_top1": qat_top1, "qat_minus_fp32": diff,
               "times_s": times, "total_s": total, "cpu_s": cpu, "targets_met": ok,
               "host": {"python": platform.python_version(), "torch": torch.__version__,
                        "machine": platform.machine(), "threads": a.threads}}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

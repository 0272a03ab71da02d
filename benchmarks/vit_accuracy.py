"""Accuracy of a small Vision Transformer on CPU: trained from scratch on scikit-learn's digits.

The model is built, reloaded and quantized only through its family object
(``trtqat.families.of_model``): FP32 training, PTQ with each calibrator (max, percentile
99.9 / 99.99, mse, entropy: one histogram collection, one amax per method), then QAT from
the best PTQ model. The loops are the library's (``trtqat.train.loop``), as are the
calibration functions (``trtqat.collect_stats`` / ``trtqat.compute_amax``). Top-1 figures are
those of the last epoch (no selection on the validation set). Targets: QAT INT8 within 1
point of FP32 top-1 and above the best PTQ calibrator. Results go to ``--out/results.json``.

    python benchmarks/vit_accuracy.py                      # vit (= vit_small) at 32x32
    python benchmarks/vit_accuracy.py --model vit_tiny --epochs 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trtqat  # noqa: E402
from trtqat import families  # noqa: E402
from trtqat.train import distributed as D  # noqa: E402
from trtqat.train.data import make_datasets, make_loader, make_loaders  # noqa: E402
from trtqat.train.loop import cosine_lambda, evaluate, train_one_epoch  # noqa: E402

# (label, compute_amax method, keyword arguments)
CALIBRATORS = (("max", "max", {}), ("percentile 99.9", "percentile", {"percentile": 99.9}),
               ("percentile 99.99", "percentile", {"percentile": 99.99}), ("mse", "mse", {}),
               ("entropy", "entropy", {}))
TARGET_GAP = 1.0  # points of top-1 between QAT INT8 and FP32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit", help="a ViT family name (vit, vit_tiny, ...)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW peak learning rate")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=float, default=2.0)
    p.add_argument("--qat-epochs", type=int, default=3)
    p.add_argument("--qat-lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--calib-batches", type=int, default=8)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 when the 1-minute load is < 0.5 per "
                   "core, else 1: two threads on a busy machine ran QAT several times slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/vit_accuracy")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    return p.parse_args(argv)


def fit(model: nn.Module, train_loader, val_loader, epochs: int, lr: float, weight_decay: float,
        warmup_epochs: float, label: str, progress: bool) -> dict[str, float]:
    """AdamW with a per-step cosine schedule; returns the last epoch's validation metrics."""
    ctx = D.DistContext()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=weight_decay)
    steps = len(train_loader)
    warmup = min(int(round(warmup_epochs * steps)), steps * epochs // 2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  cosine_lambda(steps * epochs, warmup, 0.01))
    criterion = nn.CrossEntropyLoss()
    va: dict[str, float] = {}
    for epoch in range(epochs):
        tr = train_one_epoch(model, train_loader, criterion, optimizer, scheduler, ctx, epoch,
                             progress=progress, desc=label)
        va = evaluate(model, val_loader, ctx, progress=progress)
        print(f"  {label} epoch {epoch + 1}/{epochs}: train loss {tr['loss']:.3f}, "
              f"val top-1 {va['top1']:.2f}% ({tr['time_s']:.1f} s)", flush=True)
    return va


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 when the targets are met, 1 otherwise."""
    a = parse_args(argv)
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    a.threads = a.threads or (2 if load < 0.5 else 1)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    start = time.perf_counter()
    times: dict[str, float] = {}
    family = families.of_model(a.model)
    train_loader, val_loader, classes = make_loaders("digits", a.image_size, a.batch_size,
                                                     seed=a.seed)
    calib_set = make_datasets("digits", a.image_size, a.seed, augment=False)[0]
    calib_loader = make_loader(calib_set, a.batch_size, seed=a.seed, train=True)
    model = family.build(a.model, classes, image_size=a.image_size)
    print(f"{a.model} ({family.name} family): {sum(p.numel() for p in model.parameters())} "
          f"parameters, {a.image_size}x{a.image_size} digits, {len(calib_set)} train / "
          f"{len(val_loader.dataset)} val images, {a.threads} thread(s)", flush=True)

    t = time.perf_counter()
    va = fit(model, train_loader, val_loader, a.epochs, a.lr, a.weight_decay, a.warmup_epochs,
             "fp32", a.progress)
    fp32, losses = va["top1"], {"fp32": va["loss"]}
    times["fp32"] = time.perf_counter() - t
    print(f"{'FP32':<22} top-1 {fp32:6.2f}%  val loss {va['loss']:.4f}  "
          f"({times['fp32']:.0f} s)", flush=True)

    # PTQ: the quantized model rebuilt from a checkpoint-like dict by the family, as the
    # calibrate stage will do; one histogram pass, then one amax per calibrator
    t = time.perf_counter()
    spec = {"family": family.name, "arch": a.model, "num_classes": classes,
            "image_size": a.image_size, "quantized": False, "skip_layers": []}
    qmodel = family.load({"model": spec, "state_dict": model.state_dict()}, quantized=True)
    seen = trtqat.collect_stats(qmodel, calib_loader, num_batches=a.calib_batches,
                                progress=a.progress)
    ptq: dict[str, float] = {}
    for label, method, kwargs in CALIBRATORS:
        trtqat.compute_amax(qmodel, method, **kwargs)
        va = evaluate(qmodel, val_loader, progress=a.progress)
        ptq[label], losses[f"ptq {label}"] = va["top1"], va["loss"]
        print(f"PTQ {label:<18} top-1 {ptq[label]:6.2f}%  val loss {va['loss']:.4f}",
              flush=True)
    times["ptq"] = time.perf_counter() - t
    best = max(ptq, key=lambda k: ptq[k])  # the first best, in CALIBRATORS order
    _, method, kwargs = next(c for c in CALIBRATORS if c[0] == best)
    trtqat.compute_amax(qmodel, method, **kwargs)

    t = time.perf_counter()
    va = fit(qmodel, train_loader, val_loader, a.qat_epochs, a.qat_lr, a.weight_decay, 0.0,
             "qat", a.progress)
    qat, losses["qat"] = va["top1"], va["loss"]
    times["qat"] = time.perf_counter() - t
    total = time.perf_counter() - start
    gap_ok = qat >= fp32 - TARGET_GAP
    above_ok = qat > ptq[best]
    print(f"{'QAT INT8 (from ' + best + ')':<22} top-1 {qat:6.2f}%  val loss "
          f"{losses['qat']:.4f}  ({times['qat']:.0f} s)")
    print(f"QAT - FP32 {qat - fp32:+.2f} points (target >= -{TARGET_GAP}): "
          f"{'PASS' if gap_ok else 'FAIL'}; QAT - best PTQ {qat - ptq[best]:+.2f} points "
          f"(target > 0): {'PASS' if above_ok else 'FAIL'}; total {total:.0f} s "
          f"({calib_batches_text(seen, a.batch_size)})")
    results: dict[str, Any] = {
        "model": a.model, "family": family.name, "fp32_top1": fp32, "ptq_top1": ptq,
        "best_ptq": best, "qat_top1": qat, "val_loss": losses, "qat_minus_fp32": qat - fp32,
        "qat_minus_best_ptq": qat - ptq[best], "targets_met": gap_ok and above_ok,
        "times_s": times, "total_s": total,
        "config": {**vars(a), "torch": torch.__version__, "machine": platform.machine(),
                   "cpus": os.cpu_count()}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, out / "results.json")
    return 0 if gap_ok and above_ok else 1


def calib_batches_text(seen: int, batch_size: int) -> str:
    """``calibration: N batches of B``."""
    return f"calibration: {seen} batches of {batch_size}"


if __name__ == "__main__":
    raise SystemExit(main())

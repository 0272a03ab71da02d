"""The detection family's epochs: training with a detection loss (optionally distilled from
an FP32 teacher), COCO mAP on the validation split, and the epoch loop that checkpoints
the best mAP@[.5:.95]."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from trtqat.families.detect.loss import distill_loss
from trtqat.families.detect.metrics import coco_map, postprocess
from trtqat.progress import progress as progress_of
from trtqat.runs import distributed as D
from trtqat.runs.accel import Accel
from trtqat.runs.checkpoint import copy_checkpoint, save_checkpoint
from trtqat.runs.health import NonFiniteLossError, check_epoch
from trtqat.runs.run_dir import RunDir

log = logging.getLogger(__name__)


def frozen_teacher(model: nn.Module) -> nn.Module:
    """``model`` as a distillation teacher: no gradients, training-mode outputs (raw head)
    with BatchNorm's running statistics (BN layers in eval)."""
    model.requires_grad_(False)
    model.train()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
    return model


def train_epoch(model: nn.Module, loader: Iterable, criterion: Callable, optimizer, scheduler,
                ctx: D.DistContext, epoch: int, *, acc: Accel, limit: int | None = None,
                teacher: nn.Module | None = None, distill: float = 0.0,
                progress: bool = True, desc: str = "train") -> dict[str, float]:
    """One pass: the loss (+ ``distill`` x the distillation loss from ``teacher``), the LR
    stepped every batch. :class:`NonFiniteLossError` on a NaN or infinite loss."""
    model.train()
    total, images, start = 0.0, 0, time.perf_counter()
    steps = len(loader) if limit is None else min(limit, len(loader))  # type: ignore[arg-type]
    bar = progress_of(loader, total=steps, desc=desc, enabled=progress)
    for step, (x, targets) in enumerate(bar):
        if limit is not None and step >= limit:
            break
        x = acc.inputs(x.to(ctx.device, non_blocking=True))
        with acc.autocast():
            out = model(x)
            loss = criterion(out, targets, tuple(x.shape[2:]))
            if teacher is not None and distill > 0:
                with torch.no_grad():
                    ref = teacher(x)
                loss = loss + distill * distill_loss(out, ref)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteLossError(f"the loss became {value:g} at epoch {epoch}, step {step}")
        optimizer.zero_grad(set_to_none=True)
        acc.backward_step(loss, optimizer)
        scheduler.step()
        total += value * x.shape[0]
        images += x.shape[0]
        bar.set_postfix(loss=f"{value:.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
    elapsed = time.perf_counter() - start
    return {"loss": total / max(images, 1), "images": images,
            "images_per_s": images / max(elapsed, 1e-9), "time_s": elapsed}


@torch.no_grad()
def predict(model: nn.Module, loader: Iterable, device: Any = "cpu", *, acc: Accel | None = None,
            limit: int | None = None) -> tuple[list, list]:
    """``(detections, targets)`` per image of ``model`` (eval mode) on ``loader`` (the boxes
    and class scores of a task head: see :func:`.heads.detections`)."""
    from trtqat.families.detect.heads import detections, head_of

    acc = acc or Accel(torch.device(device))
    head = head_of(getattr(model, "module", model))
    was = model.training
    model.eval()
    dets, targets = [], []
    try:
        for step, (x, t) in enumerate(loader):
            if limit is not None and step >= limit:
                break
            with acc.autocast():
                out = model(acc.inputs(x.to(acc.device)))
            dets += postprocess(detections(out, head).float())
            targets += [tt.numpy() for tt in t]
    finally:
        model.train(was)
    return dets, targets


def evaluate_map(model: nn.Module, loader: Iterable, *, acc: Accel | None = None,
                 limit: int | None = None) -> dict[str, float]:
    """``{"map", "map50", "images", "boxes", "time_s"}`` of ``model`` on ``loader``."""
    start = time.perf_counter()
    dets, targets = predict(model, loader, acc=acc, limit=limit)
    return {**coco_map(dets, targets), "time_s": time.perf_counter() - start}


def fit(*, stage: str, model: nn.Module, batches: Any, criterion: Callable, optimizer,
        scheduler, ctx: D.DistContext, acc: Accel, run: RunDir, epochs: int,
        payload: Callable[[int, dict[str, Any], float, float], dict[str, Any]],
        start_epoch: int = 0, best: float = -1.0, wall_offset: float = 0.0,
        limit: int | None = None, teacher: nn.Module | None = None, distill: float = 0.0,
        progress: bool = True) -> dict[str, Any]:
    """Epochs ``start_epoch+1 .. epochs``: train, mAP on ``batches.val``, log, checkpoint
    (``best.pt``: the best mAP@[.5:.95]). Returns the last record and the best mAP."""
    t0 = time.perf_counter()
    record: dict[str, Any] = {}
    for epoch in range(start_epoch + 1, epochs + 1):
        lr = optimizer.param_groups[0]["lr"]
        tr = train_epoch(model, batches.train, criterion, optimizer, scheduler, ctx, epoch,
                         acc=acc, limit=limit, teacher=teacher, distill=distill,
                         progress=progress, desc=f"{stage} {epoch}/{epochs}")
        va = evaluate_map(model, batches.val, acc=acc, limit=limit)
        check_epoch(model, tr["loss"], epoch, ctx)
        wall = wall_offset + time.perf_counter() - t0
        record = {"stage": stage, "epoch": epoch, "epochs": epochs, "train_loss": tr["loss"],
                  "val_map": va["map"], "val_map50": va["map50"], "lr": lr,
                  "images_per_s": tr["images_per_s"],
                  "epoch_time_s": tr["time_s"] + va["time_s"], "wall_time_s": wall,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        is_best = va["map"] > best
        best = max(best, va["map"])
        run.log_metrics(record)
        save_checkpoint(run.file("last.pt"), payload(epoch, record, best, wall))
        if is_best:
            copy_checkpoint(run.file("last.pt"), run.file("best.pt"))
        msg = (f"{stage} epoch {epoch}/{epochs}: loss {tr['loss']:.4f}  val mAP "
               f"{va['map']:.2f}  mAP@.5 {va['map50']:.2f}  lr {lr:.2e}  "
               f"{tr['images_per_s']:.0f} img/s{'  *best*' if is_best else ''}")
        if progress:
            tqdm.write(msg)
        log.info(msg)
    return {"last": record, "best_map": best}

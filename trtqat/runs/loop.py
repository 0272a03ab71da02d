"""Train and evaluate epochs, and the epoch loop shared by FP32 training and QAT."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from trtqat.progress import progress as progress_of
from trtqat.runs import distributed as D
from trtqat.runs.accel import Accel
from trtqat.runs.checkpoint import copy_checkpoint, save_checkpoint
from trtqat.runs.graphed_step import GraphedStep
from trtqat.runs.health import NonFiniteLossError, check_epoch
from trtqat.runs.run_dir import RunDir

log = logging.getLogger(__name__)


def cosine_lambda(total_steps: int, warmup_steps: int = 0, final_ratio: float = 0.0
                  ) -> Callable[[int], float]:
    """LR multiplier per step: linear warm-up, then cosine from 1 down to ``final_ratio``."""
    total_steps = max(1, total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        t = min(1.0, (step - warmup_steps) / span)
        return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    return factor


def _topk_correct(logits: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
    k = min(5, logits.shape[1])
    top = logits.topk(k, dim=1).indices
    hit = top.eq(target.unsqueeze(1))
    return int(hit[:, 0].sum()), int(hit.any(dim=1).sum())


def _totals(sums: torch.Tensor, elapsed: float, ctx: D.DistContext) -> dict[str, float]:
    """Loss, top-1/top-5 (percent), images and speed of one pass from this rank's
    ``[loss*n, top1 hits, top5 hits, n]``, summed over all ranks."""
    sums = D.all_reduce_sum(ctx, sums.to(ctx.device)).cpu()
    n = max(sums[3].item(), 1.0)
    return {"loss": sums[0].item() / n, "top1": 100.0 * sums[1].item() / n,
            "top5": 100.0 * sums[2].item() / n, "images": int(sums[3].item()),
            "images_per_s": sums[3].item() / max(elapsed, 1e-9), "time_s": elapsed}


def _steps(loader: Iterable, limit: int | None) -> int | None:
    try:
        n = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return limit
    return n if limit is None else min(n, limit)


def train_one_epoch(model: nn.Module, loader: Iterable, criterion: nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler, ctx: D.DistContext, epoch: int,
                    *, limit: int | None = None, progress: bool = True, desc: str = "train",
                    accel: Accel | None = None, graphed: GraphedStep | None = None
                    ) -> dict[str, float]:
    """One pass over ``loader`` (at most ``limit`` batches), stepping the LR every batch.

    ``accel`` adds autocast, channels_last inputs and the fp16 gradient scaler; ``graphed``
    (``--cuda-graphs``) runs each step as a replayed CUDA graph and drops a partial batch
    (one NOTE says how many samples).

    Raises :class:`NonFiniteLossError` (on every rank at once) if the loss is NaN or inf.
    """
    acc = accel or Accel(ctx.device)
    model.train()
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    sums = torch.zeros(4, dtype=torch.float64)  # loss*n, top1, top5, n
    start = time.perf_counter()
    bar = progress_of(loader, total=_steps(loader, limit), desc=desc,
                      enabled=progress and ctx.is_main)
    for step, (x, y) in enumerate(bar):
        if limit is not None and step >= limit:
            break
        x = acc.inputs(x.to(ctx.device, non_blocking=True))
        y = y.to(ctx.device, non_blocking=True)
        if graphed is not None:
            result = graphed(x, y)  # forward, backward and optimizer step: one graph
            if result is None:
                continue  # a partial batch: counted, dropped
            out, loss = result
        else:
            with acc.autocast():
                out = model(x)
                loss = criterion(out, y)
        loss_value = float(loss.detach())
        if not D.all_true(ctx, math.isfinite(loss_value)):
            raise NonFiniteLossError(f"the loss became {loss_value:g} at epoch {epoch}, "
                                     f"step {step}")
        if graphed is None:
            optimizer.zero_grad(set_to_none=True)
            acc.backward_step(loss, optimizer)
        scheduler.step()
        n = y.shape[0]
        c1, c5 = _topk_correct(out.detach(), y)
        sums += torch.tensor([loss_value * n, c1, c5, n], dtype=torch.float64)
        bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{_lr(optimizer):.2e}")
    dropped = graphed.take_dropped() if graphed is not None else 0
    if dropped and ctx.is_main:
        log.info("NOTE: --cuda-graphs dropped the last, partial batch of epoch %d (%d "
                 "sample(s)): a captured step takes one batch shape", epoch, dropped)
    return _totals(sums, time.perf_counter() - start, ctx)


def _lr(optimizer: torch.optim.Optimizer) -> float:
    """The first group's learning rate as a float (a tensor with ``--cuda-graphs``)."""
    return float(optimizer.param_groups[0]["lr"])


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, ctx: D.DistContext | None = None, *,
             criterion: nn.Module | None = None, limit: int | None = None,
             progress: bool = True, desc: str = "eval", accel: Accel | None = None
             ) -> dict[str, float]:
    """Loss, top-1 and top-5 (percent) of ``model`` on ``loader``, summed over all ranks."""
    ctx = ctx or D.DistContext()
    acc = accel or Accel(ctx.device)
    criterion = criterion or nn.CrossEntropyLoss()
    model = D.unwrap(model)
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)
    start = time.perf_counter()
    try:
        bar = progress_of(loader, total=_steps(loader, limit), desc=desc,
                          enabled=progress and ctx.is_main)
        for step, (x, y) in enumerate(bar):
            if limit is not None and step >= limit:
                break
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            with acc.autocast():
                out = model(acc.inputs(x))
                loss = float(criterion(out, y))
            c1, c5 = _topk_correct(out, y)
            n = y.shape[0]
            sums += torch.tensor([loss * n, c1, c5, n], dtype=torch.float64)
    finally:
        model.train(was_training)
    return _totals(sums, time.perf_counter() - start, ctx)


def fit(*, stage: str, model: nn.Module, train_loader: Iterable, val_loader: Iterable,
        criterion: nn.Module, optimizer: torch.optim.Optimizer, scheduler, ctx: D.DistContext,
        run: RunDir, start_epoch: int, epochs: int, best_top1: float, wall_offset: float,
        payload: Callable[[int, dict[str, Any], float, float], dict[str, Any]],
        limit: int | None = None, stop_after: int | None = None, progress: bool = True,
        accel: Accel | None = None, graphed: GraphedStep | None = None) -> dict[str, Any]:
    """Train epochs ``start_epoch+1 .. epochs``; after each, evaluate, log and checkpoint.

    ``model`` may be wrapped in DDP. ``payload(epoch, record, best_top1, wall_time)`` builds
    the checkpoint dict (it may run collectives, so it is called on every rank). Metrics are
    appended before the checkpoint is replaced, so a resume can drop lines it has no
    checkpoint for. ``graphed``: the step of ``--cuda-graphs`` (:func:`train_one_epoch`).
    Returns the last record and the best top-1.
    """

    t0 = time.perf_counter()
    record: dict[str, Any] = {}
    for epoch in range(start_epoch + 1, epochs + 1):
        lr = _lr(optimizer)
        tr = train_one_epoch(model, train_loader, criterion, optimizer, scheduler, ctx, epoch,
                             limit=limit, progress=progress, desc=f"{stage} {epoch}/{epochs}",
                             accel=accel, graphed=graphed)
        D.broadcast_buffers(ctx, D.unwrap(model))
        va = evaluate(model, val_loader, ctx, criterion=criterion, limit=limit,
                      progress=progress, desc=f"val {epoch}/{epochs}", accel=accel)
        check_epoch(model, va["loss"], epoch, ctx)  # a poisoned epoch writes no checkpoint
        wall = wall_offset + time.perf_counter() - t0
        record = {"stage": stage, "epoch": epoch, "epochs": epochs,
                  "train_loss": tr["loss"], "train_top1": tr["top1"], "train_top5": tr["top5"],
                  "val_loss": va["loss"], "val_top1": va["top1"], "val_top5": va["top5"],
                  "lr": lr, "images_per_s": tr["images_per_s"], "epoch_time_s": tr["time_s"] +
                  va["time_s"], "wall_time_s": wall, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        is_best = va["top1"] > best_top1
        best_top1 = max(best_top1, va["top1"])
        run.log_metrics(record)
        ckpt = payload(epoch, record, best_top1, wall)
        if ctx.is_main:
            save_checkpoint(run.file("last.pt"), ckpt)
            if is_best:
                copy_checkpoint(run.file("last.pt"), run.file("best.pt"))
            msg = (f"{stage} epoch {epoch}/{epochs}: loss {tr['loss']:.4f}  "
                   f"val top-1 {va['top1']:.2f}%  top-5 {va['top5']:.2f}%  lr {lr:.2e}  "
                   f"{tr['images_per_s']:.0f} img/s{'  *best*' if is_best else ''}")
            if progress:
                tqdm.write(msg)
            log.info(msg)
        D.barrier(ctx)
        if stop_after is not None and epoch >= stop_after and epoch < epochs:
            log.info("stopping after epoch %d as asked (--stop-after); continue with --resume",
                     epoch)
            break
    return {"last": record, "best_top1": best_top1}

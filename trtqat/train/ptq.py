"""Post-training quantization: ``calibrate(CalibrateConfig(checkpoint=...))``.

Loads an FP32 checkpoint, rebuilds the model with quantizers, collects statistics on
``num_batches`` training batches (eval transforms), computes amax with the chosen method,
evaluates and writes the calibrated checkpoint. Under torchrun the statistics are merged
across ranks (inside ``collect_stats``), so every rank holds the same amax.

Setting the environment variable ``TRTQAT_AMAX_DUMP=DIR`` makes every rank save its amax to
``DIR/amax_rank<R>.pt`` (used by the multi-process test).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import trtqat
from trtqat.quant.model_ops import AMAX_METHODS, disable_layers, quantizers
from trtqat.train import distributed as D
from trtqat.train import recipes as R
from trtqat.train.checkpoint import (
    CheckpointError,
    build_from_checkpoint,
    copy_checkpoint,
    save_checkpoint,
)
from trtqat.train.data import make_datasets, make_loader
from trtqat.train.loop import evaluate
from trtqat.train.run_dir import RunDir
from trtqat.train.run_lock import RunGuard

log = logging.getLogger(__name__)


@dataclass
class CalibrateConfig:
    """Options of ``trtqat calibrate``; data options default to those of the FP32 run."""

    checkpoint: str = ""
    out: str = "runs/ptq"
    method: str = "entropy"
    percentile: float = 99.99
    num_batches: int = 16
    skip_layers: tuple[str, ...] = ()
    model: str | None = None
    data: str | None = None
    image_size: int | None = None
    batch_size: int | None = None
    workers: int = 0
    seed: int = 0
    overwrite: bool = False
    device: str = "auto"
    limit_batches: int | None = None
    strict: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if not str(self.checkpoint):
            raise R.ConfigError("--checkpoint is required: the best.pt of a `trtqat train` run")
        R.check_common(self)
        R.check_positive(self, "num_batches")
        if self.method not in AMAX_METHODS:
            raise R.ConfigError(f"unknown --method {self.method!r}: use one of "
                                f"{', '.join(AMAX_METHODS)}")
        if not 0.0 < self.percentile <= 100.0:
            raise R.ConfigError(f"--percentile must be in (0, 100], got {self.percentile}")
        self.skip_layers = tuple(self.skip_layers)


def _dump_amax(model: torch.nn.Module, ctx: D.DistContext) -> None:
    folder = os.environ.get("TRTQAT_AMAX_DUMP")
    if not folder:
        return
    amax = {name: q.amax.cpu() for name, q in quantizers(model) if q.amax is not None}
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(amax, Path(folder) / f"amax_rank{ctx.rank}.pt")


def calibrate(cfg: CalibrateConfig) -> dict[str, Any]:
    """PTQ of an FP32 checkpoint; writes ``best.pt``/``last.pt`` (stage "ptq") in ``cfg.out``.

    Returns ``{"last": the metrics record, "best_top1": val top-1, "out": run folder}``.
    """
    ctx = D.setup(cfg.device)
    run = guard = None
    try:
        guard = RunGuard(cfg.out, resume=False, overwrite=cfg.overwrite, enabled=ctx.is_main,
                         inputs=[("--checkpoint", cfg.checkpoint)])
        out = guard.path
        src = R.load_source(cfg.checkpoint, ("fp32",), cfg.model, "calibrate")
        spec = dict(src["model"])
        train_args = dict(src.get("args") or {})
        data = cfg.data or train_args.get("data", "digits")
        image_size = cfg.image_size or spec.get("image_size") or train_args.get("image_size", 32)
        batch_size = cfg.batch_size or train_args.get("batch_size", 64)
        D.seed_everything(cfg.seed, ctx.rank)
        train_ds, val_ds, data_classes = make_datasets(
            data, image_size, cfg.seed, num_classes=train_args.get("num_classes"),
            strict=cfg.strict, augment=False)
        if data_classes > int(spec["num_classes"]):
            raise CheckpointError(f"the data has {data_classes} classes but the checkpoint's "
                                  f"{spec['arch']} predicts {spec['num_classes']}")
        calib_loader = make_loader(train_ds, batch_size, cfg.workers, cfg.seed,
                                   ctx.distributed, train=True)
        val_loader = make_loader(val_ds, batch_size, cfg.workers, cfg.seed, ctx.distributed,
                                 train=False)
        model = build_from_checkpoint(src, quantized=True)
        if cfg.skip_layers:
            disable_layers(model, cfg.skip_layers)
        model.to(ctx.device)
        progress = cfg.progress and ctx.is_main
        t0 = time.perf_counter()
        seen = trtqat.collect_stats(model, calib_loader, cfg.num_batches, device=ctx.device,
                                    progress=progress)
        kwargs = {"percentile": cfg.percentile} if cfg.method == "percentile" else {}
        trtqat.compute_amax(model, cfg.method, **kwargs)
        calib_s = time.perf_counter() - t0
        _dump_amax(model, ctx)
        val = evaluate(model, val_loader, ctx, limit=cfg.limit_batches, progress=progress,
                       desc="val ptq")
        images = seen * batch_size * ctx.world_size
        record = {"stage": "ptq", "epoch": 0, "method": cfg.method, "val_loss": val["loss"],
                  "val_top1": val["top1"], "val_top5": val["top5"],
                  "fp32_top1": (src.get("metrics") or {}).get("val_top1"),
                  "calib_batches": seen, "images_per_s": images / max(calib_s, 1e-9),
                  "calib_time_s": calib_s, "wall_time_s": calib_s + val["time_s"],
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        args = R.as_args(cfg, model=spec["arch"], data=data, image_size=image_size,
                         batch_size=batch_size, world_size=ctx.world_size)
        spec.update(quantized=True, skip_layers=list(cfg.skip_layers))
        calib = {"method": cfg.method, "percentile": cfg.percentile,
                 "num_batches": cfg.num_batches, "batches_seen": seen,
                 "world_size": ctx.world_size, "source": str(cfg.checkpoint)}
        ckpt = R.payload(stage="ptq", model=model, spec=spec, epoch=0, args=args, ctx=ctx,
                         metrics=record, best_top1=val["top1"], wall_time_s=calib_s,
                         calib=calib, train_args=train_args)
        if ctx.is_main:  # everything is computed: only now does the run folder appear
            run = RunDir(out)
            run.start(args, resume=False)
            run.log_metrics(record)
            save_checkpoint(run.file("last.pt"), ckpt)
            copy_checkpoint(run.file("last.pt"), run.file("best.pt"))
            msg = (f"ptq ({cfg.method}): val top-1 {val['top1']:.2f}%  top-5 {val['top5']:.2f}%"
                   f"  ({seen} batch(es) per process in {calib_s:.1f}s)")
            log.info(msg)
        D.barrier(ctx)
        return {"last": record, "best_top1": val["top1"], "out": str(out)}
    finally:
        if run is not None:
            run.close()
        if guard is not None:
            guard.close()
        D.cleanup(ctx)

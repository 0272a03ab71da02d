"""Post-training quantization: ``calibrate(CalibrateConfig(checkpoint=...))``.

Loads an FP32 checkpoint (or any float model: ``CalibrateConfig(model="my.py:make",
weights="my.pt")``, a torchvision or timm name), rebuilds the model with quantizers, collects
statistics on ``num_batches`` training batches (eval transforms; a flat image folder or a
``.npy``/``.npz`` array also works), computes amax with the chosen method, evaluates (when
the data has labels) and writes the calibrated checkpoint. Under torchrun the statistics are merged
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
from trtqat.train.accel import Accel, AccelOptions
from trtqat.train.checkpoint import (
    CheckpointError,
    build_from_checkpoint,
    copy_checkpoint,
    save_checkpoint,
)
from trtqat.train.data import make_loader
from trtqat.train.data_sources import calibration_datasets, preprocess_of
from trtqat.train.loop import evaluate
from trtqat.train.run_dir import RunDir
from trtqat.train.run_lock import RunGuard

log = logging.getLogger(__name__)


@dataclass
class CalibrateConfig(AccelOptions):
    """Options of ``trtqat calibrate``; data options default to those of the FP32 run."""

    checkpoint: str = ""
    out: str = "runs/ptq"
    weights: str | None = None  # with --model and no --checkpoint: the float weights
    num_classes: int | None = None
    method: str = "entropy"
    percentile: float = 99.99
    num_batches: int = 16
    skip_layers: tuple[str, ...] = ()
    model: str | None = None
    data: str | None = None
    image_size: int | tuple[int, int] | None = None
    resize: int | tuple[int, int] | str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channels: int | None = None
    batch_size: int | None = None
    workers: int = 0
    seed: int = 0
    overwrite: bool = False
    device: str = "auto"
    limit_batches: int | None = None
    strict: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        self.checkpoint = str(self.checkpoint or "")
        if not self.checkpoint and not self.model:
            raise R.ConfigError("--checkpoint is required: the best.pt of a `trtqat train` run "
                                "(or --model NAME|FILE.py:FACTORY [--weights FILE] to start "
                                "from a float model; --model minilm or a Hugging Face folder "
                                "for an encoder)")
        if self.checkpoint and self.weights:
            raise R.ConfigError("--weights goes with --model (a float model), not with "
                                "--checkpoint (which holds its weights)")
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
        acc = Accel.setup(cfg, ctx.device)  # bad options refused before the folder is touched
        guard = RunGuard(cfg.out, resume=False, overwrite=cfg.overwrite, enabled=ctx.is_main,
                         inputs=[("--checkpoint", cfg.checkpoint)])
        out = guard.path
        src, spec, train_args = {}, {}, {}
        if cfg.checkpoint:
            src = R.load_source(cfg.checkpoint, ("fp32",), cfg.model, "calibrate")
            spec, train_args = dict(src["model"]), dict(src.get("args") or {})
        data = cfg.data or train_args.get("data", "digits")
        prep = preprocess_of(cfg, spec.get("preprocess"),
                             spec.get("image_size") or train_args.get("image_size", 32))
        batch_size = cfg.batch_size or train_args.get("batch_size", 64)
        D.seed_everything(cfg.seed, ctx.rank)
        train_ds, val_ds, data_classes, prep = calibration_datasets(
            data, prep, cfg.seed, num_classes=train_args.get("num_classes") or cfg.num_classes,
            strict=cfg.strict)
        if cfg.checkpoint:
            model = build_from_checkpoint(src, quantized=True)
        else:
            from trtqat.train.model_source import start_from_float

            model, spec = start_from_float(cfg.model, cfg.weights, cfg.num_classes,
                                           prep.channels, prep.size)
        spec.update(image_size=prep.image_size, preprocess=prep.to_dict())
        if data_classes and data_classes > int(spec["num_classes"]):
            raise CheckpointError(f"the data has {data_classes} classes but the "
                                  f"{spec['arch']} predicts {spec['num_classes']}")
        calib_loader = make_loader(train_ds, batch_size, cfg.workers, cfg.seed,
                                   ctx.distributed, train=True)
        val_loader = None if val_ds is None else make_loader(
            val_ds, batch_size, cfg.workers, cfg.seed, ctx.distributed, train=False)
        if cfg.skip_layers:
            disable_layers(model, cfg.skip_layers)
        acc.prepare(model.to(ctx.device))
        progress = cfg.progress and ctx.is_main
        t0 = time.perf_counter()
        with acc.autocast():  # statistics are collected eagerly; --compile is for evaluation
            seen = trtqat.collect_stats(model, calib_loader, cfg.num_batches, device=ctx.device,
                                        progress=progress)
        kwargs = {"percentile": cfg.percentile} if cfg.method == "percentile" else {}
        trtqat.compute_amax(model, cfg.method, **kwargs)
        calib_s = time.perf_counter() - t0
        _dump_amax(model, ctx)
        val = {"loss": None, "top1": None, "top5": None, "time_s": 0.0}
        if val_loader is not None:
            val = evaluate(acc.compiled(model), val_loader, ctx, limit=cfg.limit_batches,
                           progress=progress, desc="val ptq", accel=acc)
        images = seen * batch_size * ctx.world_size
        record = {"stage": "ptq", "epoch": 0, "method": cfg.method, "val_loss": val["loss"],
                  "val_top1": val["top1"], "val_top5": val["top5"],
                  "fp32_top1": (src.get("metrics") or {}).get("val_top1"),
                  "calib_batches": seen, "images_per_s": images / max(calib_s, 1e-9),
                  "calib_time_s": calib_s, "wall_time_s": calib_s + val["time_s"],
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        args = R.as_args(cfg, model=spec.get("source", {}).get("model", spec["arch"]),
                         data=data, image_size=prep.image_size, resize=prep.resize,
                         mean=prep.mean, std=prep.std, channels=prep.channels,
                         batch_size=batch_size, world_size=ctx.world_size)
        spec.update(quantized=True, skip_layers=list(cfg.skip_layers))
        calib = {"method": cfg.method, "percentile": cfg.percentile,
                 "num_batches": cfg.num_batches, "batches_seen": seen,
                 "world_size": ctx.world_size,
                 "source": str(cfg.checkpoint or spec["source"]["model"])}
        best = -1.0 if val["top1"] is None else val["top1"]
        ckpt = R.payload(stage="ptq", model=model, spec=spec, epoch=0, args=args, ctx=ctx,
                         metrics=record, best_top1=best, wall_time_s=calib_s,
                         calib=calib, train_args=train_args)
        if ctx.is_main:  # everything is computed: only now does the run folder appear
            run = RunDir(out)
            run.start(args, resume=False)
            run.log_metrics(record)
            save_checkpoint(run.file("last.pt"), ckpt)
            copy_checkpoint(run.file("last.pt"), run.file("best.pt"))
            score = ("no labelled validation data" if val["top1"] is None else
                     f"val top-1 {val['top1']:.2f}%  top-5 {val['top5']:.2f}%")
            log.info("ptq (%s): %s  (%d batch(es) per process in %.1fs)", cfg.method, score,
                     seen, calib_s)
        D.barrier(ctx)
        return {"last": record, "best_top1": best, "out": str(out)}
    finally:
        if run is not None:
            run.close()
        if guard is not None:
            guard.close()
        D.cleanup(ctx)

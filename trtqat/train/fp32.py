"""FP32 training of a torchvision classification model: ``train_fp32(TrainConfig(...))``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from trtqat.train import distributed as D
from trtqat.train import recipes as R
from trtqat.train.accel import Accel, AccelOptions
from trtqat.train.data import make_loaders
from trtqat.train.data_sources import preprocess_of
from trtqat.train.health import kept_message
from trtqat.train.loop import NonFiniteLossError, fit
from trtqat.train.model_source import arch_name, describe, load_weights
from trtqat.train.model_source import build as build_model
from trtqat.train.run_dir import RunDir
from trtqat.train.run_lock import RunGuard

log = logging.getLogger(__name__)


@dataclass
class TrainConfig(AccelOptions):
    """Options of ``trtqat train`` (each field is the CLI option of the same name)."""

    model: str = "resnet18"
    num_classes: int | None = None
    weights: str | None = None  # initial weights: a state_dict/checkpoint file or a name
    data: str = "digits"
    image_size: int | tuple[int, int] = 32
    resize: int | tuple[int, int] | str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channels: int | None = None
    epochs: int = 15
    batch_size: int = 32
    lr: float = 0.05
    min_lr: float = 0.0
    momentum: float = 0.9
    weight_decay: float = 5e-4
    opt: str = "sgd"
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.0
    workers: int = 0
    seed: int = 0
    out: str = "runs/fp32"
    resume: bool = False
    overwrite: bool = False
    device: str = "auto"
    limit_batches: int | None = None
    stop_after: int | None = None
    strict: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        R.check_common(self)
        R.check_positive(self, "epochs", "lr")
        R.check_positive(self, "min_lr", "momentum", "weight_decay", "warmup_epochs", zero=True)
        R.check_positive(self, "num_classes", allow_none=True)
        if self.opt not in R.OPTIMIZERS:
            raise R.ConfigError(f"unknown --opt {self.opt!r}: use one of "
                                f"{', '.join(R.OPTIMIZERS)}")
        if self.min_lr >= self.lr:
            raise R.ConfigError(f"--min-lr ({self.min_lr}) must be below --lr ({self.lr})")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise R.ConfigError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")


def train_fp32(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg.model`` in float on ``cfg.data``; writes ``last.pt``/``best.pt`` in ``cfg.out``.

    Returns ``{"last": metrics of the last epoch, "best_top1": ..., "out": run folder}``.
    """
    ctx = D.setup(cfg.device)
    run = guard = None
    try:
        acc = Accel.setup(cfg, ctx.device)  # bad options refused before the folder is touched
        guard = RunGuard(cfg.out, cfg.resume, cfg.overwrite, enabled=ctx.is_main)
        out = guard.path
        D.seed_everything(cfg.seed, ctx.rank)
        prep = preprocess_of(cfg)
        train_loader, val_loader, data_classes = make_loaders(
            cfg.data, cfg.image_size, cfg.batch_size, cfg.workers, cfg.seed,
            distributed=ctx.distributed, num_classes=cfg.num_classes, strict=cfg.strict,
            prep=prep)
        num_classes = R.num_classes_for(cfg.num_classes, data_classes)
        args = R.as_args(cfg, num_classes=num_classes, world_size=ctx.world_size,
                         resize=prep.resize, mean=prep.mean, std=prep.std,
                         channels=prep.channels)
        resume_ckpt = R.load_resume(out, "fp32", args, ctx) if cfg.resume else None
        model, source = build_float_model(cfg.model, num_classes, cfg.weights)
        model = acc.prepare(model.to(ctx.device))
        spec = {"arch": arch_name(cfg.model), "num_classes": num_classes,
                "image_size": prep.image_size, "quantized": False, "skip_layers": [],
                "source": source, "preprocess": prep.to_dict()}
        optimizer = R.build_optimizer(cfg.opt, model, cfg.lr, cfg.momentum, cfg.weight_decay)
        steps = R.steps_per_epoch(train_loader, cfg.limit_batches)
        # Warm-up takes at most half of the schedule (short runs keep their cosine decay).
        warmup = min(int(round(cfg.warmup_epochs * steps)), steps * cfg.epochs // 2)
        scheduler = R.build_scheduler(optimizer, steps * cfg.epochs, warmup, cfg.min_lr / cfg.lr)
        start, best, wall = 0, -1.0, 0.0
        if resume_ckpt is not None:
            start, best, wall = R.restore(resume_ckpt, model, optimizer, scheduler, ctx)
            acc.load_checkpoint_state(resume_ckpt)
        run = RunDir(out, enabled=ctx.is_main)
        run.start(args, resume=cfg.resume)
        if cfg.resume:
            run.truncate_metrics("fp32", start)
            log.info("resuming %s at epoch %d/%d", out, start, cfg.epochs)

        def make_payload(epoch: int, record: dict, best_top1: float, wall_s: float) -> dict:
            return R.payload(stage="fp32", model=model, spec=spec, epoch=epoch, args=args,
                             ctx=ctx, metrics=record, optimizer=optimizer, scheduler=scheduler,
                             best_top1=best_top1, wall_time_s=wall_s, **acc.checkpoint_state())

        try:
            result = fit(stage="fp32", model=D.wrap(ctx, acc.compiled(model)),
                         train_loader=train_loader,
                         val_loader=val_loader,
                         criterion=nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
                         optimizer=optimizer, scheduler=scheduler, ctx=ctx, run=run,
                         start_epoch=start, epochs=cfg.epochs, best_top1=best,
                         wall_offset=wall, payload=make_payload, limit=cfg.limit_batches,
                         stop_after=cfg.stop_after, progress=cfg.progress, accel=acc)
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc}; stopped. {kept_message(out)} Lower --lr or "
                                     "lengthen --warmup-epochs and start again (--overwrite)"
                                     ) from None
        return {**result, "out": str(out)}
    finally:
        if run is not None:
            run.close()
        if guard is not None:
            guard.close()
        D.cleanup(ctx)


def build_float_model(source: str, num_classes: int, weights: str | None = None
                      ) -> tuple[nn.Module, dict[str, Any]]:
    """The float model to train and the record of where it came from (model_source)."""
    model = build_model(source, num_classes)
    info = describe(source)
    if weights:
        info.update(load_weights(model, source, weights, new_head=True))
    return model, info


"""Quantization-aware fine-tuning: ``qat_finetune(QATConfig(checkpoint=...))``.

Default recipe (TensorRT's guidance): about 10% of the FP32 schedule's epochs (at least 1),
starting at 1% of its learning rate, cosine-annealed per iteration down to 1% of that
starting rate. The FP32 run's options travel in the calibrated checkpoint (``train_args``).
BatchNorm stays in training mode, as in standard QAT.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from torch import nn

from trtqat.errors import QuantizerStateError
from trtqat.quant.model_ops import disable_layers, quantizers
from trtqat.train import distributed as D
from trtqat.train import recipes as R
from trtqat.train.accel import Accel, AccelOptions
from trtqat.train.checkpoint import CheckpointError, build_from_checkpoint
from trtqat.train.data import make_loaders
from trtqat.train.data_sources import preprocess_of
from trtqat.train.fp32 import TrainConfig
from trtqat.train.health import kept_message
from trtqat.train.loop import NonFiniteLossError, evaluate, fit
from trtqat.train.run_dir import RunDir
from trtqat.train.run_lock import RunGuard

log = logging.getLogger(__name__)

EPOCH_FRACTION = 0.1  # of the FP32 schedule
LR_FRACTION = 0.01  # of the FP32 learning rate
FINAL_LR_FRACTION = 0.01  # of the QAT starting rate


@dataclass
class QATConfig(AccelOptions):
    """Options of ``trtqat qat``; None means "derive from the FP32 run" (see module doc)."""

    checkpoint: str = ""
    out: str = "runs/qat"
    epochs: int | None = None
    lr: float | None = None
    min_lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    opt: str | None = None
    label_smoothing: float | None = None
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
    resume: bool = False
    overwrite: bool = False
    device: str = "auto"
    limit_batches: int | None = None
    stop_after: int | None = None
    strict: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if not str(self.checkpoint):
            raise R.ConfigError("--checkpoint is required: the best.pt of a `trtqat calibrate` run")
        R.check_common(self)
        R.check_positive(self, "epochs", "lr", allow_none=True)
        R.check_positive(self, "min_lr", "momentum", "weight_decay", allow_none=True, zero=True)
        if self.opt is not None and self.opt not in R.OPTIMIZERS:
            raise R.ConfigError(f"unknown --opt {self.opt!r}: use one of "
                                f"{', '.join(R.OPTIMIZERS)}")
        if self.label_smoothing is not None and not 0.0 <= self.label_smoothing < 1.0:
            raise R.ConfigError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.lr is not None and self.min_lr is not None and self.min_lr >= self.lr:
            raise R.ConfigError(f"--min-lr ({self.min_lr}) must be below --lr ({self.lr})")
        self.skip_layers = tuple(self.skip_layers)

    def resolved(self, train_args: dict[str, Any]) -> dict[str, Any]:
        """Every schedule option, filled in from the FP32 run's ``train_args``."""
        base = TrainConfig.__dataclass_fields__
        fp32 = {k: train_args.get(k, base[k].default) for k in
                ("epochs", "lr", "momentum", "weight_decay", "opt", "label_smoothing", "data",
                 "image_size", "batch_size")}
        epochs = self.epochs or max(1, math.ceil(EPOCH_FRACTION * fp32["epochs"]))
        lr = self.lr or LR_FRACTION * fp32["lr"]
        min_lr = FINAL_LR_FRACTION * lr if self.min_lr is None else self.min_lr
        if min_lr >= lr:
            raise R.ConfigError(f"--min-lr ({min_lr}) must be below the QAT lr ({lr})")
        pick = {k: getattr(self, k) if getattr(self, k) is not None else fp32[k]
                for k in ("momentum", "weight_decay", "opt", "label_smoothing", "data",
                          "image_size", "batch_size")}
        return {"epochs": epochs, "lr": lr, "min_lr": min_lr, **pick,
                "fp32_epochs": fp32["epochs"], "fp32_lr": fp32["lr"]}


def _check_calibrated(model: nn.Module, path: str) -> None:
    missing = [n for n, q in quantizers(model) if not q.disabled and q.amax is None]
    if missing:
        raise QuantizerStateError(f"{path}: {len(missing)} quantizer(s) have no amax (e.g. "
                                  f"{missing[0]}); calibrate the model first (trtqat calibrate)")


def qat_finetune(cfg: QATConfig) -> dict[str, Any]:
    """Fine-tune a calibrated checkpoint with fake quantization; writes the run to ``cfg.out``.

    Returns ``{"last": metrics of the last epoch, "best_top1": ..., "start_top1": ...,
    "out": run folder}``.
    """
    ctx = D.setup(cfg.device)
    run = guard = None
    try:
        acc = Accel.setup(cfg, ctx.device)  # bad options refused before the folder is touched
        guard = RunGuard(cfg.out, cfg.resume, cfg.overwrite, enabled=ctx.is_main,
                         inputs=[("--checkpoint", cfg.checkpoint)])
        out = guard.path
        src = R.load_source(cfg.checkpoint, ("ptq", "qat"), cfg.model, "qat")
        spec = dict(src["model"])
        train_args = dict(src.get("train_args") or {})
        if not train_args:
            if cfg.data is None:
                raise R.ConfigError(f"{cfg.checkpoint} was calibrated from a float model, not "
                                    "a `trtqat train` run, so QAT has no training data to "
                                    "inherit: pass --data (an ImageFolder with train/ and "
                                    "val/, or digits)")
            log.warning("%s records no FP32 run options: QAT defaults assume the %s ones",
                        cfg.checkpoint, "`trtqat train`")
        r = cfg.resolved(train_args)
        prep = preprocess_of(cfg, spec.get("preprocess"), spec.get("image_size")
                             or r["image_size"])
        r["image_size"] = prep.image_size
        D.seed_everything(cfg.seed, ctx.rank)
        train_loader, val_loader, data_classes = make_loaders(
            r["data"], r["image_size"], r["batch_size"], cfg.workers, cfg.seed,
            distributed=ctx.distributed, num_classes=train_args.get("num_classes"),
            strict=cfg.strict, prep=prep)
        if data_classes > int(spec["num_classes"]):
            raise CheckpointError(f"the data has {data_classes} classes but the checkpoint's "
                                  f"{spec['arch']} predicts {spec['num_classes']}")
        args = R.as_args(cfg, model=(spec.get("source") or {}).get("model", spec["arch"]),
                         world_size=ctx.world_size, resize=prep.resize, mean=prep.mean,
                         std=prep.std, channels=prep.channels, **r)
        spec.update(image_size=prep.image_size, preprocess=prep.to_dict())
        resume_ckpt = R.load_resume(out, "qat", args, ctx) if cfg.resume else None
        model = build_from_checkpoint(src).to(ctx.device)
        if cfg.skip_layers:  # left in float for fine-tuning; recorded with the calibrate-time ones
            disable_layers(model, cfg.skip_layers)
            spec["skip_layers"] = list(dict.fromkeys([*(spec.get("skip_layers") or []),
                                                      *cfg.skip_layers]))
        _check_calibrated(model, str(cfg.checkpoint))
        acc.prepare(model)
        fast = acc.compiled(model)  # shares model's parameters; checkpoints come from model
        optimizer = R.build_optimizer(r["opt"], model, r["lr"], r["momentum"],
                                      r["weight_decay"])
        steps = R.steps_per_epoch(train_loader, cfg.limit_batches)
        scheduler = R.build_scheduler(optimizer, steps * r["epochs"], 0, r["min_lr"] / r["lr"])
        criterion = nn.CrossEntropyLoss(label_smoothing=r["label_smoothing"])
        start, best, wall = 0, -1.0, 0.0
        start_top1 = (src.get("metrics") or {}).get("val_top1")
        if resume_ckpt is not None:
            start, best, wall = R.restore(resume_ckpt, model, optimizer, scheduler, ctx)
            acc.load_checkpoint_state(resume_ckpt)
        run = RunDir(out, enabled=ctx.is_main)
        extra = {"calib": src.get("calib"), "train_args": train_args}
        if cfg.resume:
            run.start(args, resume=True)
            run.truncate_metrics("qat", start)
        else:
            t0 = time.perf_counter()
            va = evaluate(fast, val_loader, ctx, criterion=criterion, limit=cfg.limit_batches,
                          progress=cfg.progress, desc="val start", accel=acc)
            start_top1 = va["top1"]
            run.start(args, resume=False)
            run.log_metrics({"stage": "qat", "epoch": 0, "epochs": r["epochs"],
                             "val_loss": va["loss"], "val_top1": va["top1"],
                             "val_top5": va["top5"], "lr": r["lr"],
                             "wall_time_s": time.perf_counter() - t0,
                             "time": time.strftime("%Y-%m-%dT%H:%M:%S")})

        def make_payload(epoch: int, record: dict, best_top1: float, wall_s: float) -> dict:
            return R.payload(stage="qat", model=model, spec=spec, epoch=epoch, args=args,
                             ctx=ctx, metrics=record, optimizer=optimizer, scheduler=scheduler,
                             best_top1=best_top1, wall_time_s=wall_s, **extra,
                             **acc.checkpoint_state())

        try:
            result = fit(stage="qat", model=D.wrap(ctx, fast), train_loader=train_loader,
                         val_loader=val_loader, criterion=criterion, optimizer=optimizer,
                         scheduler=scheduler, ctx=ctx, run=run, start_epoch=start,
                         epochs=r["epochs"], best_top1=best, wall_offset=wall,
                         payload=make_payload, limit=cfg.limit_batches,
                         stop_after=cfg.stop_after, progress=cfg.progress, accel=acc)
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc}; stopped. {kept_message(out)} Lower --lr and start "
                                     "again (--overwrite)") from None
        return {**result, "start_top1": start_top1, "out": str(out)}
    finally:
        if run is not None:
            run.close()
        if guard is not None:
            guard.close()
        D.cleanup(ctx)

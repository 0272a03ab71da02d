"""FP32 training of an image classifier: the CNN family's half of ``trtqat train``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from torch import nn

from trtqat.families.cnn.data_sources import preprocess_of
from trtqat.families.cnn.graphs import graphed_step
from trtqat.families.cnn.model_source import load_weights
from trtqat.families.types import StageResult
from trtqat.outputs import scoring
from trtqat.runs import distributed as D
from trtqat.runs import recipes as R
from trtqat.runs.health import kept_message
from trtqat.runs.loop import NonFiniteLossError, fit
from trtqat.runs.run_dir import RunDir

if TYPE_CHECKING:
    from trtqat.stages.train import TrainConfig

log = logging.getLogger(__name__)


def train_classifier(cfg: TrainConfig, family: Any) -> StageResult:
    """FP32 training of an image classifier of ``family`` (its ``build``): the stage code of
    :meth:`trtqat.families.cnn.CNNFamily.run_train`."""
    with R.stage(cfg, resume=cfg.resume, graphs=True) as st:
        ctx, acc, out = st.ctx, st.acc, st.out
        D.seed_everything(cfg.seed, ctx.rank)
        prep = preprocess_of(cfg)
        batches = family.data(cfg, "train", data=cfg.data, prep=prep, batch_size=cfg.batch_size,
                              num_classes=cfg.num_classes, distributed=ctx.distributed)
        train_loader, val_loader = batches.train, batches.val
        num_classes = R.num_classes_for(cfg.num_classes, batches.classes)
        args = R.as_args(cfg, num_classes=num_classes, world_size=ctx.world_size,
                         resize=prep.resize, mean=prep.mean, std=prep.std,
                         channels=prep.channels)
        resume_ckpt = R.load_resume(out, "fp32", args, ctx) if cfg.resume else None
        model, source = build_float_model(family, cfg.model, num_classes, cfg.weights,
                                          image_size=prep.image_size, channels=prep.channels)
        model.register_forward_hook(scoring(cfg.metric_output))  # several outputs: one scored
        model = acc.prepare(model.to(ctx.device))
        spec = {"arch": family.arch(cfg.model), "family": family.name,
                "num_classes": num_classes, "image_size": prep.image_size, "quantized": False,
                "skip_layers": [], "source": source, "preprocess": prep.to_dict(),
                **({"metric_output": cfg.metric_output} if cfg.metric_output else {})}
        optimizer = R.build_optimizer(cfg.opt, model, cfg.lr, cfg.momentum, cfg.weight_decay,
                                      graphs=acc.cuda_graphs)
        steps = R.steps_per_epoch(train_loader, cfg.limit_batches, drop_last=acc.cuda_graphs)
        # Warm-up takes at most half of the schedule (short runs keep their cosine decay).
        warmup = min(int(round(cfg.warmup_epochs * steps)), steps * cfg.epochs // 2)
        scheduler = R.build_scheduler(optimizer, steps * cfg.epochs, warmup, cfg.min_lr / cfg.lr)
        start, best, wall = 0, -1.0, 0.0
        if resume_ckpt is not None:
            start, best, wall = R.restore(resume_ckpt, model, optimizer, scheduler, ctx)
            acc.load_checkpoint_state(resume_ckpt)
        criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        graphed = graphed_step(model, criterion, optimizer, acc)
        st.run = run = RunDir(out, enabled=ctx.is_main)
        run.start(args, resume=cfg.resume)
        if cfg.resume:
            run.truncate_metrics("fp32", start, (resume_ckpt or {}).get("metrics"))
            log.info("resuming %s at epoch %d/%d", out, start, cfg.epochs)

        def make_payload(epoch: int, record: dict, best_top1: float, wall_s: float) -> dict:
            return R.payload(stage="fp32", model=model, spec=spec, epoch=epoch, args=args,
                             ctx=ctx, metrics=record, optimizer=optimizer, scheduler=scheduler,
                             best_top1=best_top1, wall_time_s=wall_s, **acc.checkpoint_state())

        try:
            result = fit(stage="fp32", model=D.wrap(ctx, acc.compiled(model)),
                         train_loader=train_loader,
                         val_loader=val_loader,
                         criterion=criterion, optimizer=optimizer, scheduler=scheduler, ctx=ctx, run=run,
                         start_epoch=start, epochs=cfg.epochs, best_top1=best,
                         wall_offset=wall, payload=make_payload, limit=cfg.limit_batches,
                         stop_after=cfg.stop_after, progress=cfg.progress, accel=acc,
                         graphed=graphed)
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc}; stopped. {kept_message(out, run)} Lower --lr or "
                                     "lengthen --warmup-epochs and start again (--overwrite)"
                                     ) from None
        return StageResult("train", str(out), result["last"],
                           best=top1_or_none(result["best_top1"]))


def top1_or_none(value: float) -> float | None:
    """A best top-1 (-1 while nothing was scored: None)."""
    return None if value is None or value < 0 else float(value)


def build_float_model(family: Any, source: str, num_classes: int, weights: str | None = None,
                      **geometry: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The float model to train (``family.build``, given the input ``geometry``:
    ``image_size``, ``channels``) and the record of where it came from."""
    from trtqat.families.cnn.ultralytics_cls import record

    model = family.build(source, num_classes, **geometry)
    info = {**family.origin(source), **record(model)}  # an Ultralytics classifier's yaml
    if weights:
        info.update(load_weights(model, source, weights, new_head=True))
    return model, info

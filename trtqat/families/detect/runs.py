"""The detection family's stages: ``trtqat train``, ``calibrate`` and ``qat`` of detectors.

:class:`trtqat.families.detect.DetectFamily` runs these for the library verbs with the
configs every family shares (``TrainConfig``, ``CalibrateConfig``, ``QATConfig``). Runs
are single-process (no torchrun). Checkpoints record ``best_map`` (mAP@[.5:.95], percent),
which also picks ``best.pt``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from torch import nn

from trtqat.families.detect import loop
from trtqat.families.quant_format import (
    apply_spec_format,
    int4_tables,
    record_format,
    with_format,
)
from trtqat.families.types import StageResult
from trtqat.quant.format_apply import check_format_layers
from trtqat.quant.model_ops import collect_stats, compute_amax, disable_layers
from trtqat.quant.placement import PLACEMENT_VERSION
from trtqat.runs import distributed as D
from trtqat.runs import recipes as R
from trtqat.runs.checkpoint import CheckpointError, copy_checkpoint, save_checkpoint
from trtqat.runs.health import kept_message
from trtqat.runs.loop import NonFiniteLossError
from trtqat.runs.run_dir import RunDir

if TYPE_CHECKING:
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.qat import QATConfig
    from trtqat.stages.train import TrainConfig

log = logging.getLogger(__name__)


def _single(ctx: D.DistContext) -> None:
    if ctx.world_size > 1:
        raise R.ConfigError("detectors train in one process: run without torchrun")


def _loss(family: Any, model: nn.Module, num_classes: int) -> nn.Module:
    """Ultralytics' own loss for its models, the family's otherwise."""
    from trtqat.families.detect.loss import DetectionLoss
    from trtqat.families.detect.sources import DetectorSourceError, strides
    from trtqat.families.detect.ultralytics import UltralyticsLoss, is_yolo

    if is_yolo(model):
        return UltralyticsLoss(model)
    steps = strides(model)
    if steps is None:
        raise DetectorSourceError(
            "the detector does not say its head's strides (a `strides` attribute, e.g. (8, "
            "16, 32)), so the family's loss cannot assign objects to anchors; calibrate it "
            "without training, or give the model that attribute")
    return DetectionLoss(steps, num_classes)


def _spec(family: Any, model_name: str, model: nn.Module, classes: list[str], size: Any,
          source: dict[str, Any]) -> dict[str, Any]:
    from trtqat.families.detect.ultralytics import yaml_of

    yaml = yaml_of(model)
    return {"arch": family.arch(model_name), "family": family.name,
            "num_classes": len(classes), "classes": list(classes), "image_size": size,
            "quantized": False, "skip_layers": [],
            "source": {**source, **({"yaml": yaml} if yaml is not None else {})}}


def _data(family: Any, cfg: Any, split: str, data: str | None, size: Any, batch: int):
    return family.data(cfg, split, data=data, image_size=size, batch_size=batch)


def train_detector(cfg: TrainConfig, family: Any) -> StageResult:
    """FP32 training of ``cfg.model`` on detection data; writes ``last.pt``/``best.pt``."""
    with R.stage(cfg, resume=cfg.resume) as st:
        ctx, acc, out = st.ctx, st.acc, st.out
        _single(ctx)
        D.seed_everything(cfg.seed, ctx.rank)
        batches = _data(family, cfg, "train", cfg.data, cfg.image_size, cfg.batch_size)
        classes = batches.info["classes"]
        n = R.num_classes_for(cfg.num_classes, len(classes))
        model = family.build(cfg.model, n)
        source = family.origin(cfg.model)
        if cfg.weights:
            from trtqat.families.cnn.model_source import load_weights

            source.update(load_weights(model, cfg.model, cfg.weights, new_head=True))
        spec = _spec(family, cfg.model, model, classes + [str(i) for i in range(len(classes), n)],
                     cfg.image_size, source)
        args = R.as_args(cfg, num_classes=n, world_size=1)
        resume_ckpt = R.load_resume(out, "fp32", args, ctx) if cfg.resume else None
        model = acc.prepare(model.to(ctx.device))
        criterion = _loss(family, model, n)
        optimizer = R.build_optimizer(cfg.opt, model, cfg.lr, cfg.momentum, cfg.weight_decay)
        steps = R.steps_per_epoch(batches.train, cfg.limit_batches)
        warmup = min(int(round(cfg.warmup_epochs * steps)), steps * cfg.epochs // 2)
        scheduler = R.build_scheduler(optimizer, steps * cfg.epochs, warmup, cfg.min_lr / cfg.lr)
        start, best, wall = 0, -1.0, 0.0
        if resume_ckpt is not None:
            start, _, wall = R.restore(resume_ckpt, model, optimizer, scheduler, ctx)
            best = float(resume_ckpt.get("best_map", -1.0))
        st.run = run = RunDir(out, enabled=ctx.is_main)
        run.start(args, resume=cfg.resume)
        if cfg.resume:
            run.truncate_metrics("fp32", start, (resume_ckpt or {}).get("metrics"))

        def payload(epoch: int, record: dict, best_map: float, wall_s: float) -> dict:
            return R.payload(stage="fp32", model=model, spec=spec, epoch=epoch, args=args,
                             ctx=ctx, metrics=record, optimizer=optimizer, scheduler=scheduler,
                             best_map=best_map, wall_time_s=wall_s)

        try:
            result = loop.fit(stage="fp32", model=model, batches=batches, criterion=criterion,
                              optimizer=optimizer, scheduler=scheduler, ctx=ctx, acc=acc,
                              run=run, epochs=cfg.epochs, payload=payload, start_epoch=start,
                              best=best, wall_offset=wall, limit=cfg.limit_batches,
                              progress=cfg.progress)
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc}; stopped. {kept_message(out, run)} Lower --lr and start "
                                     "again (--overwrite)") from None
        return _result("train", out, result)


def _result(stage: str, out: Any, fitted: dict[str, Any], before: float | None = None
            ) -> StageResult:
    best = fitted.get("best_map")
    return StageResult(stage, str(out), dict(fitted.get("last") or {}),
                       best=None if best is None or best < 0 else float(best), before=before,
                       metric="map")


def calibrate_detector(cfg: CalibrateConfig, family: Any, src: dict[str, Any] | None
                       ) -> StageResult:
    """PTQ of a detector checkpoint (``src``) or of the float ``cfg.model``; writes the
    "ptq" run (``best_map``: the validation mAP after calibration)."""
    with R.stage(cfg, inputs=[("--checkpoint", cfg.checkpoint)]) as st:
        ctx, acc = st.ctx, st.acc
        _single(ctx)
        train_args: dict[str, Any] = {}
        if src is not None:
            src = R.load_source(cfg.checkpoint, ("fp32",), cfg.model, "calibrate", src)
            train_args = dict(src.get("args") or {})
        r = family.recipe("calibrate", cfg, src)
        method = cfg.method or r["method"]
        data = cfg.data or train_args.get("data") or "digits"
        spec0 = (src or {}).get("model") or {}
        size = cfg.image_size or spec0.get("image_size") or r["image_size"]
        batch_size = cfg.batch_size or train_args.get("batch_size") or r["batch_size"]
        D.seed_everything(cfg.seed, ctx.rank)
        batches = _data(family, cfg, "calib", data, size, batch_size)
        classes = batches.info["classes"]
        if src is not None:
            model = family.load(with_format(src, cfg.format, cfg.block_size,
                                               int4_tables(cfg)), quantized=True)
            spec = dict(src["model"])
            if len(classes) > int(spec["num_classes"]):
                raise CheckpointError(f"the data has {len(classes)} classes but the "
                                      f"{spec['arch']} predicts {spec['num_classes']}")
        else:
            n = cfg.num_classes or len(classes)
            model = family.build(cfg.model, n)
            source = family.origin(cfg.model)
            if cfg.weights:
                from trtqat.families.cnn.model_source import load_weights

                source.update(load_weights(model, cfg.model, cfg.weights))
            spec = _spec(family, cfg.model, model, classes, size, source)
            family.quantize(model)
            apply_spec_format(model, record_format(spec, cfg.format, cfg.block_size,
                                                    int4_tables(cfg)))
        record_format(spec, cfg.format, cfg.block_size, int4_tables(cfg))
        if cfg.skip_layers:
            disable_layers(model, cfg.skip_layers)
        check_format_layers(model, cfg.format)
        model = acc.prepare(model.to(ctx.device))
        t0 = time.perf_counter()
        with acc.autocast():
            seen = collect_stats(model, batches.train, cfg.num_batches, device=ctx.device,
                                 progress=cfg.progress)
        compute_amax(model, method, **({"percentile": cfg.percentile}
                                       if method == "percentile" else {}))
        calib_s = time.perf_counter() - t0
        val = loop.evaluate_map(model, batches.val, acc=acc, limit=cfg.limit_batches)
        record = {"stage": "ptq", "epoch": 0, "method": method, "val_map": val["map"],
                  "val_map50": val["map50"],
                  "fp32_map": ((src or {}).get("metrics") or {}).get("val_map"),
                  "calib_batches": seen, "calib_time_s": calib_s,
                  "wall_time_s": calib_s + val["time_s"],
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        args = R.as_args(cfg, model=spec["source"]["model"], data=data, image_size=size,
                         batch_size=batch_size, world_size=1, method=method)
        spec.update(quantized=True, skip_layers=list(cfg.skip_layers), image_size=size,
                    placement=PLACEMENT_VERSION)
        calib = {"method": method, "percentile": cfg.percentile,
                 "num_batches": cfg.num_batches, "batches_seen": seen,
                 "source": str(cfg.checkpoint or spec["source"]["model"])}
        ckpt = R.payload(stage="ptq", model=model, spec=spec, epoch=0, args=args, ctx=ctx,
                         metrics=record, best_map=val["map"], wall_time_s=calib_s,
                         calib=calib, train_args=train_args)
        st.run = RunDir(st.out)
        st.run.start(args, resume=False)
        st.run.log_metrics(record)
        save_checkpoint(st.run.file("last.pt"), ckpt)
        copy_checkpoint(st.run.file("last.pt"), st.run.file("best.pt"))
        log.info("ptq (%s): val mAP %.2f  mAP@.5 %.2f  (%d batch(es) in %.1fs)", method,
                 val["map"], val["map50"], seen, calib_s)
        return _result("calibrate", st.out, {"last": record, "best_map": val["map"]})


# Detectors fine-tune longer and harder than TensorRT's classifier guidance (10% of the
# epochs at 1% of the lr): on the digits detector that recipe moved the weights too little
# for QAT to beat PTQ (-0.10 +- 0.31 mAP@[.5:.95] over seeds 0-2), 20% at 10% gained
# +0.38 +- 0.53 (benchmarks/detect_accuracy.py; README).
QAT_EPOCH_FRACTION = 0.2
QAT_LR_FRACTION = 0.1


def qat_recipe(cfg: QATConfig, src: dict[str, Any],
               train_recipe: dict[str, Any]) -> dict[str, Any]:
    """The detectors' QAT recipe from the FP32 run the checkpoint records (``train_recipe``
    where it records nothing): 20% of its epochs, at least 1; 10% of its lr, cosine to 1%
    of that (TensorRT's schedule shape, see :data:`QAT_EPOCH_FRACTION`); the loss is the
    model's own (``ultralytics`` or ``detect``), ``distill`` the weight of the FP32
    teacher's term."""
    from trtqat.runs.qat_recipe import FINAL_LR_FRACTION, qat_epochs

    fp32 = {**train_recipe, **{k: v for k, v in (src.get("train_args") or {}).items()
                               if v is not None}}
    epochs = cfg.epochs or qat_epochs(fp32["epochs"], QAT_EPOCH_FRACTION)
    lr = cfg.lr or QAT_LR_FRACTION * fp32["lr"]
    min_lr = FINAL_LR_FRACTION * lr if cfg.min_lr is None else cfg.min_lr
    if min_lr >= lr:
        raise R.ConfigError(f"--min-lr ({min_lr}) must be below the QAT lr ({lr})")
    pick = {k: getattr(cfg, k) if getattr(cfg, k, None) is not None else fp32.get(k)
            for k in ("momentum", "weight_decay", "opt", "data", "batch_size")}
    kind = ((src.get("model") or {}).get("source") or {}).get("kind")
    return {"epochs": epochs, "lr": lr, "min_lr": min_lr, **pick,
            "image_size": cfg.image_size or src["model"].get("image_size"),
            "distill": float(getattr(cfg, "distill", None) or 0.0),
            "fp32_epochs": fp32["epochs"], "fp32_lr": fp32["lr"],
            "loss": "ultralytics" if kind == "ultralytics" else "detect"}


def qat_detector(cfg: QATConfig, family: Any, src: dict[str, Any]) -> StageResult:
    """QAT of a calibrated detector checkpoint; writes the "qat" run (``best.pt``: the
    best validation mAP@[.5:.95] of its epochs)."""
    if cfg.resume:
        raise R.ConfigError("--resume is not supported for detector QAT: start again with "
                            "--overwrite")
    with R.stage(cfg, inputs=[("--checkpoint", cfg.checkpoint)]) as st:
        ctx, acc, out = st.ctx, st.acc, st.out
        _single(ctx)
        src = R.load_source(cfg.checkpoint, ("ptq", "qat"), cfg.model, "qat", src)
        spec = dict(src["model"])
        r = family.recipe("qat", cfg, src)
        D.seed_everything(cfg.seed, ctx.rank)
        batches = _data(family, cfg, "train", r["data"] or "digits", r["image_size"],
                        r["batch_size"])
        model = family.load(src).to(ctx.device)
        if cfg.skip_layers:
            disable_layers(model, cfg.skip_layers)
            spec["skip_layers"] = list(dict.fromkeys([*(spec.get("skip_layers") or []),
                                                      *cfg.skip_layers]))
        from trtqat.families.cnn.qat import _check_calibrated

        _check_calibrated(model, str(cfg.checkpoint))
        acc.prepare(model)
        teacher = None
        if r["distill"] > 0 and r["loss"] == "ultralytics":
            raise R.ConfigError("--distill works with the family's loss (raw head tensors); "
                                "an Ultralytics model trains with its own loss: drop --distill")
        if r["distill"] > 0:
            teacher = loop.frozen_teacher(family.load(src, quantized=False).to(ctx.device))
        criterion = _loss(family, model, int(spec["num_classes"]))
        optimizer = R.build_optimizer(r["opt"], model, r["lr"], r["momentum"],
                                      r["weight_decay"])
        steps = R.steps_per_epoch(batches.train, cfg.limit_batches)
        scheduler = R.build_scheduler(optimizer, steps * r["epochs"], 0, r["min_lr"] / r["lr"])
        recorded = {k: v for k, v in r.items() if k != "loss"}
        args = R.as_args(cfg, model=spec["source"]["model"], world_size=1, **recorded)
        start = loop.evaluate_map(model, batches.val, acc=acc, limit=cfg.limit_batches)
        st.run = run = RunDir(out)
        run.start(args, resume=False)
        run.log_metrics({"stage": "qat", "epoch": 0, "epochs": r["epochs"],
                         "val_map": start["map"], "val_map50": start["map50"], "lr": r["lr"],
                         "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
        extra = {"calib": src.get("calib"), "train_args": src.get("train_args") or {}}

        def payload(epoch: int, record: dict, best_map: float, wall_s: float) -> dict:
            return R.payload(stage="qat", model=model, spec=spec, epoch=epoch, args=args,
                             ctx=ctx, metrics=record, optimizer=optimizer, scheduler=scheduler,
                             best_map=best_map, wall_time_s=wall_s, **extra)

        try:
            result = loop.fit(stage="qat", model=model, batches=batches, criterion=criterion,
                              optimizer=optimizer, scheduler=scheduler, ctx=ctx, acc=acc,
                              run=run, epochs=r["epochs"], payload=payload,
                              limit=cfg.limit_batches, teacher=teacher, distill=r["distill"],
                              progress=cfg.progress)
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc}; stopped. {kept_message(out, run)} Lower --lr and start "
                                     "again (--overwrite)") from None
        return _result("qat", out, result, before=start["map"])

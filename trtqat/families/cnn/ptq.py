"""PTQ of an image classifier: the CNN family's half of ``trtqat calibrate``.

Setting the environment variable ``TRTQAT_AMAX_DUMP=DIR`` makes every rank save its amax to
``DIR/amax_rank<R>.pt`` (used by the multi-process test).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trtqat.families.cnn.data_sources import preprocess_of
from trtqat.families.quant_format import (
    apply_spec_format,
    int4_tables,
    record_format,
    with_format,
)
from trtqat.families.types import StageResult
from trtqat.outputs import scoring
from trtqat.quant.format_apply import check_format_layers
from trtqat.quant.model_ops import collect_stats, compute_amax, disable_layers, quantizers
from trtqat.quant.placement import PLACEMENT_VERSION
from trtqat.quant.placement.describe import owners
from trtqat.runs import distributed as D
from trtqat.runs import recipes as R
from trtqat.runs.checkpoint import CheckpointError, copy_checkpoint, save_checkpoint
from trtqat.runs.loop import evaluate
from trtqat.runs.run_dir import RunDir

if TYPE_CHECKING:
    from trtqat.stages.calibrate import CalibrateConfig

log = logging.getLogger(__name__)


def _dump_amax(model: torch.nn.Module, ctx: D.DistContext) -> None:
    folder = os.environ.get("TRTQAT_AMAX_DUMP")
    if not folder:
        return
    amax = {name: q.amax.cpu() for name, q in quantizers(model) if q.amax is not None}
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(amax, Path(folder) / f"amax_rank{ctx.rank}.pt")


def calibrate_classifier(cfg: CalibrateConfig, family: Any, src: dict[str, Any] | None
                         ) -> StageResult:
    """PTQ of an image classifier of ``family``: the stage code of
    :meth:`trtqat.families.cnn.CNNFamily.run_calibrate` (``src``: the loaded checkpoint,
    None to start from the float ``cfg.model``). Writes ``best.pt``/``last.pt`` (stage
    "ptq"); the result's ``best`` is the val top-1 (None without labelled data).
    """
    with R.stage(cfg, inputs=[("--checkpoint", cfg.checkpoint)]) as st:
        ctx, acc = st.ctx, st.acc
        spec, train_args = {}, {}
        if src is not None:
            src = R.load_source(cfg.checkpoint, ("fp32",), cfg.model, "calibrate", src)
            spec, train_args = dict(src["model"]), dict(src.get("args") or {})
        method = cfg.method or family.recipe("calibrate", cfg, src)["method"]
        data = cfg.data or train_args.get("data", "digits")
        R.check_preprocess_applies(cfg, data)
        prep = preprocess_of(cfg, spec.get("preprocess"),
                             spec.get("image_size") or train_args.get("image_size", 32))
        batch_size = cfg.batch_size or train_args.get("batch_size", 64)
        D.seed_everything(cfg.seed, ctx.rank)
        batches = family.data(cfg, "calib", data=data, prep=prep, batch_size=batch_size,
                              num_classes=train_args.get("num_classes") or cfg.num_classes,
                              distributed=ctx.distributed)
        prep = batches.info["prep"]  # an array's own size and channels
        R.check_array_size(cfg, data, prep.size)
        if src is not None:  # placed, made cfg.format, then the FP32 weights
            model = family.load(with_format(src, cfg.format, cfg.block_size,
                                               int4_tables(cfg)), quantized=True)
        else:
            model, spec = _start_from_float(family, cfg, prep, batches.classes)
        record_format(spec, cfg.format, cfg.block_size, int4_tables(cfg))
        spec.update(image_size=prep.image_size, preprocess=prep.to_dict(), family=family.name)
        which = cfg.metric_output or spec.get("metric_output")
        model.register_forward_hook(scoring(which))  # several outputs: the one scored
        if which:
            spec["metric_output"] = which
        if batches.classes and batches.classes > int(spec["num_classes"]):
            raise CheckpointError(f"the data has {batches.classes} classes but the "
                                  f"{spec['arch']} predicts {spec['num_classes']}")
        if cfg.skip_layers:
            disable_layers(model, cfg.skip_layers)
        check_format_layers(model, cfg.format)
        acc.prepare(model.to(ctx.device))
        progress = cfg.progress and ctx.is_main
        t0 = time.perf_counter()
        with acc.autocast():  # statistics are collected eagerly; --compile is for evaluation
            left_out: list[str] = []  # quantizers of modules that never ran: float
            seen = collect_stats(model, batches.train, cfg.num_batches, device=ctx.device,
                                 progress=progress, left_out=left_out)
        compute_amax(model, method, **({"percentile": cfg.percentile}
                                       if method == "percentile" else {}))
        calib_s = time.perf_counter() - t0
        _dump_amax(model, ctx)
        val = {"loss": None, "top1": None, "top5": None, "time_s": 0.0}
        if batches.val is not None:
            val = evaluate(acc.compiled(model), batches.val, ctx, limit=cfg.limit_batches,
                           progress=progress, desc="val ptq", accel=acc)
        images = seen * batch_size * ctx.world_size
        record = {"stage": "ptq", "epoch": 0, "method": method, "val_loss": val["loss"],
                  "val_top1": val["top1"], "val_top5": val["top5"],
                  "fp32_top1": ((src or {}).get("metrics") or {}).get("val_top1"),
                  "calib_batches": seen, "images_per_s": images / max(calib_s, 1e-9),
                  "calib_time_s": calib_s, "wall_time_s": calib_s + val["time_s"],
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        args = R.as_args(cfg, model=spec.get("source", {}).get("model", spec["arch"]),
                         data=data, image_size=prep.image_size, resize=prep.resize,
                         mean=prep.mean, std=prep.std, channels=prep.channels,
                         batch_size=batch_size, world_size=ctx.world_size, method=method)
        skip = list(dict.fromkeys([*cfg.skip_layers, *owners(left_out)]))
        spec.update(quantized=True, skip_layers=skip, placement=PLACEMENT_VERSION)
        calib = {"method": method, "percentile": cfg.percentile,
                 "num_batches": cfg.num_batches, "batches_seen": seen,
                 "world_size": ctx.world_size,
                 "source": str(cfg.checkpoint or spec["source"]["model"])}
        best = -1.0 if val["top1"] is None else val["top1"]
        ckpt = R.payload(stage="ptq", model=model, spec=spec, epoch=0, args=args, ctx=ctx,
                         metrics=record, best_top1=best, wall_time_s=calib_s,
                         calib=calib, train_args=train_args)
        if ctx.is_main:  # everything is computed: only now does the run folder appear
            st.run = RunDir(st.out)
            try:  # all of the run or none of it (a full disk leaves no run without checkpoint)
                st.run.start(args, resume=False)
                save_checkpoint(st.run.file("last.pt"), ckpt)
                copy_checkpoint(st.run.file("last.pt"), st.run.file("best.pt"))
                st.run.log_metrics(record)
            except BaseException:
                st.run.discard()
                raise
            score = ("no labelled validation data" if val["top1"] is None else
                     f"val top-1 {val['top1']:.2f}%  top-5 {val['top5']:.2f}%")
            log.info("ptq (%s): %s  (%d batch(es) per process in %.1fs)", method, score,
                     seen, calib_s)
        D.barrier(ctx)
        return StageResult("calibrate", str(st.out), record, best=val["top1"])


def _start_from_float(family: Any, cfg: CalibrateConfig, prep: Any,
                      data_classes: int | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A fake-quantized (uncalibrated) model holding the float weights of ``cfg.model``, and
    its checkpoint ``model`` spec (the class count read from the output when not given; an
    Ultralytics classifier's head is built for the data's ``data_classes``)."""
    from trtqat.families.cnn import ultralytics_cls
    from trtqat.families.cnn.model_source import load_weights, output_classes

    classes = cfg.num_classes
    if classes is None and data_classes and ultralytics_cls.is_classifier(cfg.model):
        classes = data_classes
        log.warning("NOTE %s: its Classify head is built for the data's %d classes "
                    "(--num-classes N sets another count)", cfg.model, classes)
    model = family.build(cfg.model, classes, image_size=prep.image_size,
                         channels=prep.channels)
    info = {**family.origin(cfg.model), **ultralytics_cls.record(model)}
    if cfg.weights:
        info.update(load_weights(model, cfg.model, cfg.weights))
    classes = output_classes(model, prep.channels, prep.size, cfg.metric_output)
    spec = {"arch": family.arch(cfg.model), "num_classes": classes, "quantized": True,
            "skip_layers": [], "source": info}
    family.quantize(model)
    return apply_spec_format(model, record_format(spec, cfg.format, cfg.block_size,
                                                    int4_tables(cfg))), spec

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

from trtqat.quant.calib.registry import methods
from trtqat.quant.model_ops import (
    collect_stats,
    compute_amax,
    disable_layers,
    quantizers,
)
from trtqat.runopts import RunOptions
from trtqat.train import distributed as D
from trtqat.train import recipes as R
from trtqat.train.checkpoint import CheckpointError, copy_checkpoint, save_checkpoint
from trtqat.train.data_sources import preprocess_of
from trtqat.train.loop import evaluate
from trtqat.train.run_dir import RunDir

log = logging.getLogger(__name__)

CHECKPOINT_REQUIRED = ("--checkpoint is required: the best.pt of a `trtqat train` run (or "
                       "--model NAME|FILE.py:FACTORY [--weights FILE] to start from a float "
                       "model; --model minilm or a Hugging Face folder for an encoder)")


@dataclass
class CalibrateConfig(R.ImageOptions, RunOptions):
    """Options of ``trtqat calibrate``, for every model family.

    None takes the family's default (``--method``: entropy for image classifiers, mse for
    encoders) or what the FP32 run recorded (data options). ``num_sentences``,
    ``max_length`` and ``fp32_out`` are the encoders' own; ``calibrate_encoder`` takes this
    config too (as ``EncoderCalibConfig``).
    """

    checkpoint: str = ""
    out: str = "runs/ptq"
    weights: str | None = None  # with --model and no --checkpoint: the float weights
    num_classes: int | None = None
    method: str | None = None
    percentile: float = 99.99
    num_batches: int = 16
    skip_layers: tuple[str, ...] = ()
    num_sentences: int = 512
    max_length: int | None = None
    fp32_out: str | None = None

    def __post_init__(self) -> None:
        self.checkpoint = str(self.checkpoint or "")
        if self.checkpoint and self.weights:
            raise R.ConfigError("--weights goes with --model (a float model), not with "
                                "--checkpoint (which holds its weights)")
        super().__post_init__()
        R.check_data(self)
        R.check_positive(self, "num_batches", "num_sentences")
        R.check_positive(self, "max_length", allow_none=True)
        if self.method is not None and self.method not in methods():
            raise R.ConfigError(f"unknown --method {self.method!r}: use one of "
                                f"{', '.join(methods())}")
        if not 0.0 < self.percentile <= 100.0:
            raise R.ConfigError(f"--percentile must be in (0, 100], got {self.percentile}")


def calibrate(cfg: CalibrateConfig) -> dict[str, Any]:
    """PTQ of ``cfg.checkpoint`` (or of the float ``cfg.model``): writes the "ptq" run.

    The family of the checkpoint or model (``trtqat.families``) runs the stage. Returns
    ``{"last": the metrics record, "out": run folder, "summary": one line, ...}``.
    """
    from trtqat import families

    if not cfg.checkpoint and not cfg.model:
        raise R.ConfigError(CHECKPOINT_REQUIRED)
    family, src = families.of_source(cfg.checkpoint, cfg.model)
    return families.summarized(family, "calibrate", family.run_calibrate(cfg, src))


def _dump_amax(model: torch.nn.Module, ctx: D.DistContext) -> None:
    folder = os.environ.get("TRTQAT_AMAX_DUMP")
    if not folder:
        return
    amax = {name: q.amax.cpu() for name, q in quantizers(model) if q.amax is not None}
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(amax, Path(folder) / f"amax_rank{ctx.rank}.pt")


def calibrate_classifier(cfg: CalibrateConfig, family: Any, src: dict[str, Any] | None
                         ) -> dict[str, Any]:
    """PTQ of an image classifier of ``family``: the stage code of
    :meth:`trtqat.families.cnn.CNNFamily.run_calibrate` (``src``: the loaded checkpoint,
    None to start from the float ``cfg.model``). Writes ``best.pt``/``last.pt`` (stage
    "ptq"); returns ``{"last": the metrics record, "best_top1": val top-1, "out"}``.
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
        if src is not None:
            model = family.load(src, quantized=True)
        else:
            model, spec = _start_from_float(family, cfg, prep)
        spec.update(image_size=prep.image_size, preprocess=prep.to_dict(), family=family.name)
        if batches.classes and batches.classes > int(spec["num_classes"]):
            raise CheckpointError(f"the data has {batches.classes} classes but the "
                                  f"{spec['arch']} predicts {spec['num_classes']}")
        if cfg.skip_layers:
            disable_layers(model, cfg.skip_layers)
        acc.prepare(model.to(ctx.device))
        progress = cfg.progress and ctx.is_main
        t0 = time.perf_counter()
        with acc.autocast():  # statistics are collected eagerly; --compile is for evaluation
            seen = collect_stats(model, batches.train, cfg.num_batches, device=ctx.device,
                                 progress=progress)
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
        spec.update(quantized=True, skip_layers=list(cfg.skip_layers))
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
        return {"last": record, "best_top1": best, "out": str(st.out)}


def _start_from_float(family: Any, cfg: CalibrateConfig, prep: Any
                      ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A fake-quantized (uncalibrated) model holding the float weights of ``cfg.model``, and
    its checkpoint ``model`` spec (the class count read from the output when not given)."""
    from trtqat.train.model_source import load_weights, output_classes

    model = family.build(cfg.model, cfg.num_classes, image_size=prep.image_size,
                         channels=prep.channels)
    info = family.origin(cfg.model)
    if cfg.weights:
        info.update(load_weights(model, cfg.model, cfg.weights))
    classes = output_classes(model, prep.channels, prep.size)
    spec = {"arch": family.arch(cfg.model), "num_classes": classes, "quantized": True,
            "skip_layers": [], "source": info}
    return family.quantize(model), spec

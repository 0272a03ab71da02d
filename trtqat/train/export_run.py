"""``export_checkpoint``: a checkpoint of any family to checked ONNX variants.

The family (:func:`trtqat.families.of_checkpoint`) loads the model and builds its
:class:`~trtqat.export.onnx_export.ExportPlan` (``family.export_plan``); one
:class:`~trtqat.export.onnx_export.Exporter` writes every variant under the one naming rule
(:func:`trtqat.variants.artifact_name`), then ``export.json`` sums it up. The image
classifiers' plan (CNN, and families derived from it) is :func:`image_export` here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from torch import nn

log = logging.getLogger(__name__)


@dataclass
class ExportOptions:
    """Options of ``trtqat export`` (family-specific ones are refused by the others)."""

    checkpoint: str = ""
    variant: str = "all"
    out: str = "export"
    opset: int = 17
    batch: int | None = None            # images: a fixed batch (None: dynamic)
    dynamic: tuple[str, ...] | None = None  # images: of batch, height, width
    image_size: Any = None              # images
    io_dtype: str = "fp32"              # images: input/output dtype of fp16 variants
    val_batches: int | None = None      # images
    fold_bn: bool = True                # images
    skip_layers: tuple[str, ...] = ()   # images
    max_length: int | None = None       # encoders: tokens of the traced example
    data: str | None = None             # validation data (default: the checkpoint's)
    validate: bool = True


@dataclass
class FamilyExport:
    """What a family's ``export_plan`` returns besides the plan itself."""

    plan: Any                           # trtqat.export.onnx_export.ExportPlan
    arch: str                           # the model part of file names
    shape: str                          # printed after each file: "dynamic batch", ...
    batch: int | None = None            # a fixed batch: file names end in -b<N>
    io_dtype: str = "float32"
    metadata: dict[str, str] = field(default_factory=dict)  # every file's
    info: dict[str, Any] = field(default_factory=dict)      # added to export.json


def export_checkpoint(options: ExportOptions, echo: Callable[[str], None] = print) -> int:
    """Export every requested variant of ``options.checkpoint``; print each file's checks;
    write ``export.json``. :class:`ExportError` if any variant failed its checks."""
    from trtqat import families
    from trtqat.export import ExportError
    from trtqat.export.calibrated import refuse_uncalibrated
    from trtqat.export.onnx_export import Exporter
    from trtqat.export.result import check_writable
    from trtqat.finite import check_finite_arrays
    from trtqat.train.checkpoint import load_checkpoint
    from trtqat.variants import INT8_VARIANTS, artifact_name, expand_variants, stage_tag

    variants = expand_variants(options.variant)
    ckpt = load_checkpoint(options.checkpoint)
    check_finite_arrays(ckpt["state_dict"].items(), f"checkpoint {options.checkpoint}",
                        "nothing exported; retrain it with a lower --lr")
    family = families.of_checkpoint(ckpt)
    spec, stage = ckpt["model"], str(ckpt.get("stage", "fp32"))
    int8 = any(v in INT8_VARIANTS for v in variants)
    if int8 and not spec.get("quantized"):
        raise ExportError(
            f"{options.checkpoint} is a {stage} checkpoint without quantizer state, so it has "
            "no INT8 form: run `trtqat calibrate` (PTQ) or `trtqat qat` first, or export "
            "--variant fp32/fp16")
    model = family.load(ckpt)
    if int8:
        refuse_uncalibrated(model)  # before any file is written
    job = family.export_plan(model, ckpt, options)
    exporter = Exporter(model, family.stamp_plan(job.plan))
    tag = stage_tag(ckpt)
    out = Path(options.out)
    paths = {v: out / artifact_name(job.arch, tag, v, job.batch) for v in variants}
    refuse_foreign_exports(out, paths.values(), options.checkpoint)
    check_writable(out)  # the folder appears only now that everything is checked
    failed, summary = [], []
    for variant, path in paths.items():
        result, ok = _export_one(exporter, path, variant, options, job)
        if not ok:
            failed.append(path.name)
        echo(f"{path.name}  ({variant}, opset {result.opset}, {job.shape})")
        for line in result.lines():
            echo(f"  {line}")
        echo(f"  -> {path if ok else 'not written'}")
        summary.append(result.to_dict() | {"written": ok})
    _write_summary(out, options, {"family": family.checkpoint_tag or family.name, **job.info},
                   summary)
    if failed:
        raise ExportError(f"{len(failed)} of {len(variants)} variant(s) failed their checks "
                          f"and were not written: {', '.join(failed)}")
    return 0


def refuse_foreign_exports(out: Path, paths: Any, checkpoint: str) -> None:
    """Before anything is written: every name (read from the checkpoint) stays in ``out``,
    and the files to replace are earlier exports (ONNX models, an export summary)."""
    from trtqat.atomic import json_with_keys, refuse_foreign
    from trtqat.export import ExportError
    from trtqat.export.result import is_onnx_model

    for path in paths:
        if path.parent != out or path.name in ("", ".", ".."):
            raise ExportError(f"{checkpoint} names an output outside --out ({path}); nothing "
                              "exported")
        refuse_foreign(path, is_onnx_model, "an ONNX model (an earlier export)", "--out")
    refuse_foreign(out / "export.json", json_with_keys("checkpoint", "variant", "results"),
                   "an earlier export summary (export.json)", "--out")


def _export_one(exporter, path: Path, variant: str, options: ExportOptions, job: FamilyExport):
    from trtqat.export import ValidationError

    try:
        return exporter.export(path, variant, options.opset, io_dtype=job.io_dtype,
                               validate=options.validate, metadata=job.metadata), True
    except ValidationError as exc:
        return exc.result, False


def _write_summary(out: Path, options: ExportOptions, info: dict[str, Any],
                   results: list[dict[str, Any]]) -> None:
    from trtqat.atomic import write_json

    payload = {"checkpoint": str(options.checkpoint), "variant": options.variant,
               "opset": options.opset, **info, "results": results}
    write_json(out / "export.json", payload)


# ------------------------------------------------------------------ image classifiers
def image_export(family, model: nn.Module, ckpt: dict[str, Any], options: ExportOptions
                 ) -> FamilyExport:
    """The export of an image classifier: example images of the checkpoint's size, the
    validation split of its data, ``--skip-layers`` left in float."""
    from trtqat.export.onnx_export import image_plan
    from trtqat.train.data_sources import make_preprocess

    spec = ckpt["model"]
    if options.skip_layers:
        from trtqat.quant.model_ops import disable_layers

        disable_layers(model, tuple(options.skip_layers))  # an unknown pattern: clear error
    # recorded in the int8 files' metadata, so `trtqat lint` knows these are float on purpose
    model.trtqat_skip_layers = tuple(dict.fromkeys([*(spec.get("skip_layers") or []),
                                                    *options.skip_layers]))
    prep = make_preprocess(options.image_size, recorded=spec.get("preprocess"),
                           default_size=spec.get("image_size") or 32)
    axes = dynamic_axes(options)
    batch = options.batch or (None if "batch" in axes else 1)
    inputs = family.export_inputs(model, {**spec, "input_size": prep.size,
                                          "channels": prep.channels, "dynamic": axes}, batch)
    val = None if not options.validate else _validation_loader(ckpt, options, prep)
    plan = image_plan(inputs.example, validation_data=val, dynamic_axes=axes,
                      fold_bn=options.fold_bn)
    plan.input_names, plan.output_names = inputs.input_names, inputs.output_names
    plan.checks = family.export_check
    shape = (f"dynamic {', '.join(axes)}" if axes else "static") + (
        f", batch {batch}" if batch else "")
    size = [a if a in axes else n for a, n in zip(("height", "width"), prep.size)]
    return FamilyExport(
        plan, str(spec["arch"]), "dynamic batch" if axes == ("batch",) else shape,
        batch=options.batch, io_dtype=options.io_dtype,
        info={"batch": batch or "dynamic", "dynamic": list(axes),
              "input_shape": [batch or "N", prep.channels, *size]})


def dynamic_axes(options: ExportOptions) -> tuple[str, ...]:
    """``--dynamic`` checked against ``--batch``: batch alone by default."""
    from trtqat.export import ExportError

    if options.dynamic is None:
        return ("batch",) if options.batch is None else ()
    if options.batch is not None and "batch" in options.dynamic:
        raise ExportError(f"--batch {options.batch} fixes the batch, but --dynamic "
                          f"{','.join(options.dynamic)} makes it dynamic: drop one of them")
    return tuple(options.dynamic)


def _validation_loader(ckpt: dict[str, Any], options: ExportOptions, prep):
    """The validation split of the checkpoint's data (its images alone for unlabelled data:
    a flat folder or an array)."""
    from trtqat.train.data import make_loader
    from trtqat.train.data_sources import calibration_datasets

    saved = ckpt.get("args") or {}
    data = options.data or (saved.get("data") if isinstance(saved, dict) else None) or "digits"
    kwargs = {}
    if data == "synthetic":
        kwargs["num_classes"] = int(ckpt["model"]["num_classes"])
    images, val, _, _ = calibration_datasets(data, prep, **kwargs)
    loader = make_loader(images if val is None else val, batch_size=64, train=False)
    return loader if options.val_batches is None else list(islice(loader, options.val_batches))

"""The export of an image classifier: the CNN family's half of ``trtqat export``."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any

from torch import nn

from trtqat.families.types import FamilyExport

if TYPE_CHECKING:
    from trtqat.stages.export import ExportOptions


# ------------------------------------------------------------------ image classifiers
def image_export(family, model: nn.Module, ckpt: dict[str, Any], options: ExportOptions
                 ) -> FamilyExport:
    """The export of an image classifier: example images of the checkpoint's size, the
    validation split of its data, ``--skip-layers`` left in float."""
    from trtqat.families.cnn.data_sources import make_preprocess
    from trtqat.families.cnn.ultralytics_cls import export_mode

    spec = ckpt["model"]
    export_mode(model)  # an Ultralytics classifier's output0: its probabilities
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
    plan, shape = family_plan(family, inputs, options, val, axes, batch)
    size = [a if a in axes else n for a, n in zip(("height", "width"), prep.size)]
    return FamilyExport(
        plan, str(spec["arch"]), "dynamic batch" if axes == ("batch",) else shape,
        batch=options.batch, io_dtype=options.io_dtype,
        info={"batch": batch or "dynamic", "dynamic": list(axes),
              "input_shape": [batch or "N", prep.channels, *size]})


def family_plan(family, inputs, options: ExportOptions, validation_data, axes: tuple[str, ...],
                batch: int | None):
    """The image :class:`ExportPlan` of ``inputs`` with the options' names and the family's
    check, and the shape's description (``dynamic batch, height`` / ``static, batch 1``)."""
    from trtqat.export.onnx_export import image_plan

    plan = image_plan(inputs.example, validation_data=validation_data, dynamic_axes=axes,
                      fold_bn=options.fold_bn)
    plan.input_names = list(options.input_names) or inputs.input_names
    plan.output_names = list(options.output_names) or inputs.output_names
    plan.checks = family.export_check
    shape = (f"dynamic {', '.join(axes)}" if axes else "static") + (
        f", batch {batch}" if batch else "")
    return plan, shape


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
    from trtqat.families.cnn.data import calibration_datasets, make_loader

    saved = ckpt.get("args") or {}
    data = options.data or (saved.get("data") if isinstance(saved, dict) else None) or "digits"
    kwargs = {}
    if data == "synthetic":
        kwargs["num_classes"] = int(ckpt["model"]["num_classes"])
    images, val, _, _ = calibration_datasets(data, prep, **kwargs)
    loader = make_loader(images if val is None else val, batch_size=64, train=False)
    return loader if options.val_batches is None else list(islice(loader, options.val_batches))

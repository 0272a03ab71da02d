"""What ``trtqat compare`` (and ``demo``) scores a detector on: the validation split of the
runs' detection data, by COCO mAP (``map`` = mAP@[.5:.95], ``map50``). An Ultralytics
segment, pose or OBB model is scored by the mAP of its boxes (box and class channels; the
detection data has no masks, keypoints or angles to score the rest against)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.families.types import CompareError, EvalData, Variant


def detection_data(family: Any, variants: list[Variant], settings: dict[str, Any], cfg: Any
                   ) -> EvalData:
    """Validation images and their boxes, a few training batches to calibrate ORT's int8
    re-encoding; missing ONNX files are exported as ``trtqat export`` would."""
    from trtqat.families.detect.data import datasets, loader

    data = cfg.data or settings.get("data") or "digits"
    size = cfg.image_size or settings.get("image_size") or 96
    batch = max(cfg.batch_sizes)
    train, val, classes = datasets(data, size)
    if len(val) < batch:
        raise CompareError(f"the validation split has {len(val)} images, fewer than the "
                           f"largest batch size {batch}: lower --batch-sizes")
    scored = [(x.numpy(), [t.numpy() for t in ts]) for x, ts in loader(val, batch, False)]
    calib = [x.numpy() for x, _ in islice(loader(train, batch, True), cfg.calib_batches)]
    images = np.concatenate([x for x, _ in scored])
    targets = np.empty(len(images), dtype=object)
    targets[:] = [t for _, ts in scored for t in ts]

    exporters: dict[tuple[Any, bool], Any] = {}  # one trace per checkpoint and kind

    def export(variant: Variant, path: Path, validate: bool) -> None:
        from trtqat.variants import variant as variant_row

        key = (variant.checkpoint, variant_row(variant.export_variant).int8)
        if key not in exporters:
            exporters[key] = _exporter(family, variant, scored)
        exporters[key].export(path, variant.export_variant, validate=validate)

    sample = tuple(images.shape[1:])
    head = _head(variants)
    return EvalData(
        [x for x, _ in scored], targets, calib, lambda b: np.ascontiguousarray(images[:b]),
        (sample, sample), "map", export,
        {"data": data, "image_size": size, "val_images": len(images),
         "boxes": int(sum(len(t) for t in targets)), "num_classes": len(classes),
         "calib_batches": len(calib),
         **({"head": head.task, "map_of": "boxes"} if head.task != "detect" else {})},
        metric_args={"head": head})


def _head(variants: list[Variant]) -> Any:
    """The head the runs' checkpoints record (its class count: an Ultralytics segment,
    pose or OBB head's output0 holds more channels after the class scores), else the one
    an explicit ONNX file's metadata records; a plain ``detect`` head where none does."""
    from trtqat.families.detect.heads import Head, head_of_record
    from trtqat.runs.checkpoint import load_checkpoint

    for variant in variants:
        if variant.checkpoint is not None:
            spec = load_checkpoint(variant.checkpoint)["model"]
            return head_of_record(spec.get("source"), int(spec["num_classes"]))
    for variant in variants:
        if variant.onnx is not None and Path(variant.onnx).is_file():
            import onnx

            from trtqat.engines.detect_agreement import layout_of

            layout = layout_of(onnx.load(str(variant.onnx), load_external_data=False))
            if layout.classes is not None:
                return Head(layout.head, layout.classes, layout.keypoints)
    return Head()


def _exporter(family: Any, variant: Variant, scored: list) -> Any:
    """The exporter of a variant's checkpoint: its model (the family's float layers and the
    checkpoint's skip layers marked), example and validation images, names and checks."""
    import torch

    from trtqat.export.onnx_export import Exporter, image_plan
    from trtqat.families.detect.export import head_plan
    from trtqat.families.detect.sources import float_layers, io_names
    from trtqat.families.detect.ultralytics import anchors_follow_input

    model = family.load_variant(variant)
    anchors_follow_input(model)
    skip: tuple[str, ...] = ()
    if variant.checkpoint is not None:
        from trtqat.runs.checkpoint import load_checkpoint

        skip = tuple(load_checkpoint(variant.checkpoint)["model"].get("skip_layers") or ())
    model.trtqat_skip_layers = tuple(dict.fromkeys([*float_layers(model), *skip]))
    plan = image_plan(torch.from_numpy(scored[0][0][:2]), dynamic_batch=True,
                      validation_data=[torch.from_numpy(x) for x, _ in scored[:2]])
    plan.input_names, plan.output_names = io_names(model)
    return Exporter(model, family.stamp_plan(head_plan(plan, model)))

"""What ``compare`` measures every variant on, whatever the family: :class:`EvalData`.

A family builds it (``family.compare_data``); the image classifiers' is :func:`image_data`
(labelled validation images, top-1/top-5), the encoders' is
:func:`trtqat.compare.sentences.sentence_data` (held-out sentences, embedding fidelity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.compare.variants import CompareError, Variant

Feed = dict[str, np.ndarray] | np.ndarray  # by input name, or the one input's array


@dataclass
class EvalData:
    """Inputs and targets of the accuracy (or fidelity) measurement, and what else the
    stages need: calibration feeds, timing feeds, engine shapes, the export of a variant."""

    batches: list[Feed]                      # scored, in order
    targets: np.ndarray                      # labels, or FP32 reference outputs
    calib: list[Feed]                        # ORT int8 re-encoding calibration
    timing: Callable[[int], Feed]            # the timing feed of one batch size
    dims: tuple[tuple[int, ...], tuple[int, ...]]  # input shape after the batch: min, opt
    metric: str                              # the report's headline metric
    export: Callable[[Variant, Path, bool], None]  # (variant, onnx path, validate)
    info: dict[str, Any] = field(default_factory=dict)
    output: str | None = None                # the output scored (None: the first)


def feed_for(feed: Feed, names: list[str], source: Path | str) -> dict[str, np.ndarray]:
    """``feed`` as ``{input name: array}`` for a file with inputs ``names``."""
    if not isinstance(feed, dict):
        if len(names) != 1:
            raise CompareError(f"{source} has {len(names)} inputs; this data feeds one")
        return {names[0]: feed}
    missing = [n for n in names if n not in feed]
    if missing:
        raise CompareError(f"{source} wants input '{missing[0]}', which the data does not "
                           "make: is it an export of this model?")
    return {n: feed[n] for n in names}


# ------------------------------------------------------------------ image classifiers
def image_data(family, variants: list[Variant], settings: dict[str, Any], cfg) -> EvalData:
    """The validation split of the runs' data (labels: top-1/top-5) and a few training
    batches for calibration; missing ONNX files are exported as ``trtqat export`` would."""
    from trtqat.train.data import make_loaders
    from trtqat.train.data_sources import make_preprocess

    data = cfg.data or settings.get("data") or "digits"
    image_size = cfg.image_size or settings.get("image_size")
    if not image_size:
        raise CompareError("cannot tell the image size: pass --image-size")
    batch = max(cfg.batch_sizes)
    prep = make_preprocess(image_size, recorded=settings.get("preprocess"))
    train_loader, val_loader, num_classes = make_loaders(data, image_size, batch_size=batch,
                                                         prep=prep)
    n_val = len(val_loader.dataset)
    if n_val < batch:
        raise CompareError(f"the validation split has {n_val} images, fewer than the largest "
                           f"batch size {batch}: lower --batch-sizes or use more data")
    val = [(x.numpy(), y.numpy()) for x, y in val_loader]
    calib = []
    for x, _ in train_loader:
        calib.append(x.numpy())
        if len(calib) >= cfg.calib_batches:
            break
    images = np.concatenate([x for x, _ in val])

    def export(variant: Variant, path: Path, validate: bool) -> None:
        import torch

        from trtqat.export import export_onnx
        from trtqat.export.onnx_export import image_plan

        model = _load(family, variant)
        validation = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in val]
        plan = image_plan(torch.from_numpy(val[0][0][:2]), dynamic_batch=True,
                          validation_data=validation)
        export_onnx(model, family.stamp_plan(plan), path, variant=variant.export_variant,
                    validate=validate)

    sample = tuple(val[0][0].shape[1:])
    return EvalData(
        [x for x, _ in val], np.concatenate([y for _, y in val]), calib,
        lambda b: np.ascontiguousarray(images[:b]), (sample, sample), "top1", export,
        {"data": data, "image_size": image_size, "val_images": n_val,
         "num_classes": num_classes, "calib_batches": len(calib)})


def _load(family, variant: Variant):
    """The variant's model from its checkpoint (quantized for INT8 variants), eval mode."""
    from trtqat.train.checkpoint import load_checkpoint
    from trtqat.variants import variant as variant_row

    ckpt = load_checkpoint(variant.checkpoint)
    return family.load(ckpt, quantized=variant_row(variant.export_variant).int8).eval()

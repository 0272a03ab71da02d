"""What ``trtqat compare`` scores an image classifier on: labelled validation images."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtqat.families.types import CompareError, EvalData, Variant

if TYPE_CHECKING:
    pass


# ------------------------------------------------------------------ image classifiers
def image_data(family, variants: list[Variant], settings: dict[str, Any], cfg) -> EvalData:
    """The validation split of the runs' data (labels: top-1/top-5) and a few training
    batches for calibration; missing ONNX files are exported as ``trtqat export`` would."""
    from trtqat.families.cnn.data import make_datasets, make_loader
    from trtqat.families.cnn.data_sources import make_preprocess

    data = cfg.data or settings.get("data") or "digits"
    image_size = cfg.image_size or settings.get("image_size")
    if not image_size:
        raise CompareError("cannot tell the image size: pass --image-size")
    batch = max(cfg.batch_sizes)
    prep = make_preprocess(image_size, recorded=settings.get("preprocess"))
    # The ORT re-encoding's calibration and agreement-check inputs are training images
    # without augmentation (its random crops and flips made every build check other inputs,
    # and could flip its verdict), in the seeded shuffle's order.
    calib_set, val_set, num_classes = make_datasets(data, image_size, augment=False, prep=prep)
    val_loader = make_loader(val_set, batch, train=False)
    n_val = len(val_loader.dataset)
    if n_val < batch:
        raise CompareError(f"the validation split has {n_val} images, fewer than the largest "
                           f"batch size {batch}: lower --batch-sizes or use more data")
    val = [(x.numpy(), y.numpy()) for x, y in val_loader]
    calib = []
    for x, _ in make_loader(calib_set, batch, train=True):
        calib.append(x.numpy())
        if len(calib) >= cfg.calib_batches:
            break
    images = np.concatenate([x for x, _ in val])

    def export(variant: Variant, path: Path, validate: bool) -> None:
        import torch

        from trtqat.export import export_onnx
        from trtqat.export.onnx_export import image_plan
        from trtqat.families.cnn.ultralytics_cls import export_mode

        model = family.load_variant(variant)
        export_mode(model)  # as `trtqat export` writes it
        validation = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in val]
        plan = image_plan(torch.from_numpy(val[0][0][:2]), dynamic_batch=True,
                          validation_data=validation)
        own = (getattr(model, "input_names", None), getattr(model, "output_names", None))
        if all(own):  # the model's own names, as `trtqat export` writes them (Ultralytics')
            plan.input_names, plan.output_names = list(own[0]), list(own[1])
        export_onnx(model, family.stamp_plan(plan), path, variant=variant.export_variant,
                    validate=validate)

    sample = tuple(val[0][0].shape[1:])
    return EvalData(
        [x for x, _ in val], np.concatenate([y for _, y in val]), calib,
        lambda b: np.ascontiguousarray(images[:b]), (sample, sample), "top1", export,
        {"data": data, "image_size": image_size, "val_images": n_val,
         "num_classes": num_classes, "calib_batches": len(calib)})

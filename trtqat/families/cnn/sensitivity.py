"""The batches ``trtqat sensitivity`` scores an image classifier on."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any

import torch

from trtqat.families.types import SensitivityError

if TYPE_CHECKING:
    from trtqat.stages.sensitivity import SensitivityConfig


def image_batches(ckpt: dict[str, Any], cfg: SensitivityConfig, device: torch.device
                  ) -> tuple[list, dict[str, Any]]:
    """Validation ``(images, labels)`` batches of the checkpoint's data (or ``cfg.data``),
    on ``device``, and what they are (data, image size, batch size)."""
    from trtqat.families.cnn.data import make_loaders
    from trtqat.families.cnn.data_sources import make_preprocess

    spec = ckpt["model"]
    args = ckpt.get("args") or {}
    train_args = ckpt.get("train_args") or {}
    data = cfg.data or args.get("data") or train_args.get("data") or "digits"
    prep = make_preprocess(cfg.image_size, recorded=spec.get("preprocess"),
                           default_size=spec.get("image_size") or args.get("image_size") or 32)
    image_size = prep.image_size
    batch_size = int(cfg.batch_size or args.get("batch_size") or 64)
    kwargs = {"num_classes": int(spec["num_classes"])} if data == "synthetic" else {}
    _, val_loader, _ = make_loaders(data, image_size, batch_size, 0, 0, prep=prep, **kwargs)
    batches = [(x.to(device), y.to(device)) for x, y in islice(val_loader, cfg.batches)]
    if not batches:
        raise SensitivityError(f"the validation split of {data!r} is empty")
    return batches, {"data": data, "image_size": image_size, "batch_size": batch_size}

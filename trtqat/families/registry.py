"""The registered model families, in the order they are asked to claim a model or checkpoint.

A new family is one module under ``trtqat/families/`` and one line here. The CNN family
comes last: it claims every model (torchvision, timm, file.py:factory) no other family does.
"""

from __future__ import annotations

FAMILIES: list[tuple[str, str]] = [  # (name, "module:Class"), imported on first use
    ("encoder", "trtqat.families.encoder:EncoderFamily"),
    ("vit", "trtqat.families.vit:ViTFamily"),
    ("detect", "trtqat.families.detect:DetectFamily"),
    ("cnn", "trtqat.families.cnn:CNNFamily"),
]

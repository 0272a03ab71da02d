"""The registered model families, in the order they are asked to claim a model or checkpoint.

A new family is one module under ``trtqat/families/`` and one line here. The CNN family
comes last: it claims every model name (torchvision, timm) no other family does, and
``file.py:factory``; a path that no family claims is an error listing each one's summary.
"""

from __future__ import annotations

FAMILIES: list[tuple[str, str]] = [  # (name, "module:Class"), imported on first use
    ("encoder", "trtqat.families.encoder:EncoderFamily"),
    ("vit", "trtqat.families.vit:ViTFamily"),
    ("detect", "trtqat.families.detect:DetectFamily"),
    ("cnn", "trtqat.families.cnn:CNNFamily"),
]

"""Vision Transformers (``vit_tiny``/``vit_small``, torchvision's ``vit_*``): an image
classifier family with the encoders' attention quantization."""

from trtqat.families.vit.family import (
    ViTConfigError,
    ViTFamily,
    ViTSelfAttention,
    fuse_qkv_keys,
    replace_attention,
)

__all__ = ["ViTConfigError", "ViTFamily", "ViTSelfAttention", "fuse_qkv_keys",
           "replace_attention"]

"""``nn.functional``: :func:`clip` with broadcasting and learnable-bound gradients."""

from trtqat.quant.clip import ClipFunction, clip

__all__ = ["ClipFunction", "clip"]

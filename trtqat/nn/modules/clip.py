"""``nn.modules.clip``: :class:`Clip`, a clamp with learnable bounds."""

from trtqat.quant.clip import Clip

__all__ = ["Clip"]

"""``nn.modules.quant_linear``: :class:`QuantLinear` (alias ``Linear``)."""

from trtqat.quant.modules import QuantLinear

Linear = QuantLinear

__all__ = ["Linear", "QuantLinear"]

"""``nn.modules.quant_instancenorm``: instance norms with a quantized input."""

from trtqat.quant.modules import QuantInstanceNorm1d, QuantInstanceNorm2d, QuantInstanceNorm3d

__all__ = ["QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d"]

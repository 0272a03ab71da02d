"""``nn.modules.tensor_quantizer``: :class:`TensorQuantizer`."""

from trtqat.quant.tensor_quantizer import TensorQuantizer

__all__ = ["TensorQuantizer"]

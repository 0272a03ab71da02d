"""pytorch-quantization's ``utils``: :func:`reduce_amax`."""

from trtqat.utils.reduce_amax import reduce_amax

__all__ = ["reduce_amax"]

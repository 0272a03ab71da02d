"""pytorch-quantization's ``calib.max`` module path: :class:`MaxCalibrator`."""

from trtqat.quant.calib.max import MaxCalibrator

__all__ = ["MaxCalibrator"]

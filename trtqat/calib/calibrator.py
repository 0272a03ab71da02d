"""pytorch-quantization's ``calib.calibrator`` module path: the calibrator base class."""

from trtqat.quant.calib.base import Calibrator

_Calibrator = Calibrator  # pytorch-quantization's name for the base class

__all__ = ["Calibrator"]

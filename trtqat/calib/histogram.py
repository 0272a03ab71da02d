"""pytorch-quantization's ``calib.histogram`` module path: the histogram calibrator."""

from trtqat.quant.calib.histogram import HistogramCalibrator
from trtqat.quant.calib.weights import calibrate_weights

__all__ = ["HistogramCalibrator", "calibrate_weights"]

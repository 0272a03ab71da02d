"""Calibrators: turn statistics of a tensor into its quantization range (amax)."""

from trtqat.quant.calib.base import Calibrator
from trtqat.quant.calib.histogram import HistogramCalibrator
from trtqat.quant.calib.max import MaxCalibrator
from trtqat.quant.calib.weights import calibrate_weights

__all__ = ["Calibrator", "HistogramCalibrator", "MaxCalibrator", "calibrate_weights"]

"""Calibrators: turn statistics of a tensor into its quantization range (amax)."""

from trtqat.quant.calib.base import Calibrator
from trtqat.quant.calib.histogram import HistogramCalibrator
from trtqat.quant.calib.max import MaxCalibrator

__all__ = ["Calibrator", "HistogramCalibrator", "MaxCalibrator"]

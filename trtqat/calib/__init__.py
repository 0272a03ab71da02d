"""pytorch-quantization's ``calib`` namespace."""

from trtqat.quant.calib import Calibrator, HistogramCalibrator, MaxCalibrator

__all__ = ["Calibrator", "HistogramCalibrator", "MaxCalibrator"]

"""pytorch-quantization's ``calib`` namespace."""

from trtqat.quant.calib import Calibrator, HistogramCalibrator, MaxCalibrator, calibrate_weights

__all__ = ["Calibrator", "HistogramCalibrator", "MaxCalibrator", "calibrate_weights"]

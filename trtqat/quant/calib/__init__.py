"""Calibrators: turn statistics of a tensor into its quantization range (amax).

Methods and calibrators are registered by name in :mod:`trtqat.quant.calib.registry`
(torch-free to import); the classes below load torch on first access.
"""

from trtqat.lazy import lazy_attributes

__all__ = ["AmaxMethod", "Calibrator", "HistogramCalibrator", "MaxCalibrator",
           "calibrate_weights", "make_calibrator", "methods", "register_calibrator",
           "register_method"]

_REG = "trtqat.quant.calib.registry"
__getattr__, __dir__ = lazy_attributes(__name__, {
    "Calibrator": "trtqat.quant.calib.base",
    "HistogramCalibrator": "trtqat.quant.calib.histogram",
    "MaxCalibrator": "trtqat.quant.calib.max",
    "calibrate_weights": "trtqat.quant.calib.weights",
    **{name: _REG for name in ("AmaxMethod", "make_calibrator", "methods",
                               "register_calibrator", "register_method")},
}, submodules=("base", "distributed", "histogram", "max", "registry", "thresholds", "weights"))

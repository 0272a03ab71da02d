"""trtqat: quantization-aware training to fast INT8 TensorRT / ONNX Runtime engines.

The top-level names (``trtqat.quantize``, ``trtqat.initialize`` ...) load torch on first
use, so that ``import trtqat.engines`` (ONNX Runtime / TensorRT engines) runs without torch.
"""

from trtqat.errors import TrtqatError
from trtqat.lazy import lazy_attributes

__version__ = "0.1.0"

# pytorch-quantization's package also exposes initialize / deactivate at the top level.
__all__ = ["QuantConfig", "QuantDescriptor", "QuantModuleReplacementHelper", "TrtqatError",
           "__version__", "calibrate", "collect_stats", "compute_amax", "deactivate",
           "describe", "enable_onnx_export", "initialize", "quantize", "quantize_"]

_QM = "trtqat.quant.quant_modules"
__getattr__, __dir__ = lazy_attributes(__name__, {
    "QuantConfig": "trtqat.quant.config", "QuantDescriptor": "trtqat.quant.descriptor",
    "collect_stats": "trtqat.quant.model_ops", "compute_amax": "trtqat.quant.model_ops",
    "quantize": "trtqat.quant.api", "quantize_": "trtqat.quant.api",
    "calibrate": "trtqat.quant.api", "describe": "trtqat.quant.placement",
    "QuantModuleReplacementHelper": _QM,
    "deactivate": _QM, "enable_onnx_export": _QM, "initialize": _QM,
}, submodules=("quant",))

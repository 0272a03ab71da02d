"""trtqat: quantization-aware training to fast INT8 TensorRT / ONNX Runtime engines.

The top-level names (``trtqat.quantize``, ``trtqat.initialize`` ...) load torch on first
use, so that ``import trtqat.engines`` (ONNX Runtime / TensorRT engines) runs without torch.
"""

from trtqat.errors import TrtqatError
from trtqat.lazy import lazy_attributes

__version__ = "0.1.0"

# pytorch-quantization's package also exposes initialize / deactivate at the top level, and
# its subpackages (calib, nn, tensor_quant, utils, ...) as attributes once imported: here they
# import on first access.
__all__ = ["QuantConfig", "QuantDescriptor", "QuantModuleReplacementHelper", "TrtqatError",
           "__version__", "collect_stats", "compute_amax", "deactivate", "enable_onnx_export",
           "initialize", "quantize"]

_QM = "trtqat.quant.quant_modules"
__getattr__, __dir__ = lazy_attributes(__name__, {
    "QuantConfig": "trtqat.quant.model_ops", "QuantDescriptor": "trtqat.quant.descriptor",
    "collect_stats": "trtqat.quant.model_ops", "compute_amax": "trtqat.quant.model_ops",
    "quantize": "trtqat.quant.model_ops", "QuantModuleReplacementHelper": _QM,
    "deactivate": _QM, "enable_onnx_export": _QM, "initialize": _QM,
}, submodules=("calib", "nn", "optim", "quant", "quant_modules", "tensor_quant", "utils"))

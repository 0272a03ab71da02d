"""trtqat: quantization-aware training to fast INT8 TensorRT / ONNX Runtime engines."""

from trtqat.errors import TrtqatError
from trtqat.quant import (
    QuantConfig,
    QuantDescriptor,
    collect_stats,
    compute_amax,
    quantize,
)
from trtqat.quant.quant_modules import (
    QuantModuleReplacementHelper,
    deactivate,
    enable_onnx_export,
    initialize,
)

__version__ = "0.1.0"

# pytorch-quantization's package also exposes initialize / deactivate at the top level.
__all__ = ["QuantConfig", "QuantDescriptor", "QuantModuleReplacementHelper", "TrtqatError",
           "__version__", "collect_stats", "compute_amax", "deactivate", "enable_onnx_export",
           "initialize", "quantize"]

"""trtqat: quantization-aware training to fast INT8 TensorRT / ONNX Runtime engines."""

from trtqat.errors import TrtqatError
from trtqat.quant import (
    QuantConfig,
    QuantDescriptor,
    collect_stats,
    compute_amax,
    quantize,
)
from trtqat.quant.quant_modules import enable_onnx_export

__version__ = "0.1.0"

__all__ = ["QuantConfig", "QuantDescriptor", "TrtqatError", "__version__", "collect_stats",
           "compute_amax", "enable_onnx_export", "quantize"]

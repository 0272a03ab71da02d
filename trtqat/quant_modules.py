"""pytorch-quantization's ``quant_modules``: ``initialize()`` / ``deactivate()``."""

from trtqat.quant.quant_modules import (
    DEFAULT_QUANT_MAP,
    QuantModuleReplacementHelper,
    deactivate,
    enable_onnx_export,
    initialize,
    initialized,
    is_active,
)

__all__ = ["DEFAULT_QUANT_MAP", "QuantModuleReplacementHelper", "deactivate",
           "enable_onnx_export", "initialize", "initialized", "is_active"]

"""pytorch-quantization's ``quant_modules``: ``initialize()`` / ``deactivate()``."""

from trtqat.quant.quant_modules import (  # noqa: F401  (_DEFAULT_QUANT_MAP, _quant_entry)
    _DEFAULT_QUANT_MAP,
    DEFAULT_QUANT_MAP,
    QuantModuleReplacementHelper,
    _quant_entry,
    deactivate,
    enable_onnx_export,
    initialize,
    initialized,
    is_active,
)

__all__ = ["DEFAULT_QUANT_MAP", "QuantModuleReplacementHelper", "deactivate",
           "enable_onnx_export", "initialize", "initialized", "is_active"]

"""trtqat: quantization-aware training to fast INT8 TensorRT / ONNX Runtime engines.

The top-level names (``trtqat.quantize``, ``trtqat.initialize`` ...) load torch on first
use, so that ``import trtqat.engines`` (ONNX Runtime / TensorRT engines) runs without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from trtqat.errors import TrtqatError

__version__ = "0.1.0"

# name -> module that defines it (imported on first access)
_LAZY = {
    "QuantConfig": "trtqat.quant", "QuantDescriptor": "trtqat.quant",
    "collect_stats": "trtqat.quant", "compute_amax": "trtqat.quant", "quantize": "trtqat.quant",
    "QuantModuleReplacementHelper": "trtqat.quant.quant_modules",
    "deactivate": "trtqat.quant.quant_modules",
    "enable_onnx_export": "trtqat.quant.quant_modules",
    "initialize": "trtqat.quant.quant_modules",
}
# subpackages that ``import trtqat`` used to load eagerly: still reachable as attributes
_SUBMODULES = ("quant",)

# pytorch-quantization's package also exposes initialize / deactivate at the top level.
__all__ = ["QuantConfig", "QuantDescriptor", "QuantModuleReplacementHelper", "TrtqatError",
           "__version__", "collect_stats", "compute_amax", "deactivate", "enable_onnx_export",
           "initialize", "quantize"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))

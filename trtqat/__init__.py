"""trtqat: quantization-aware training to fast INT8 TensorRT / ONNX Runtime engines.

The top-level names (``trtqat.quantize``, ``trtqat.export_onnx``, ``trtqat.qat_recipe``,
``trtqat.initialize`` ...) load torch on first use, so that ``import trtqat.engines`` (ONNX
Runtime / TensorRT engines) runs without torch; ``trtqat.build_engine`` and
``trtqat.benchmark`` never load it. See README.md, "Python API".
"""

from trtqat.errors import TrtqatError
from trtqat.lazy import lazy_attributes

__version__ = "0.1.0"

# pytorch-quantization's package also exposes initialize / deactivate at the top level, and
# its subpackages (calib, nn, tensor_quant, utils, ...) as attributes once imported: here they
# import on first access.
__all__ = ["BenchmarkResult", "ExportResult", "QATRecipe", "QuantConfig", "QuantDescriptor",
           "QuantModuleReplacementHelper", "TrtqatError", "__version__", "benchmark",
           "build_engine", "calibrate", "collect_stats", "compute_amax", "deactivate",
           "describe", "enable_onnx_export", "export_onnx", "initialize", "qat_recipe",
           "quantize", "quantize_"]

_QM = "trtqat.quant.quant_modules"
__getattr__, __dir__ = lazy_attributes(__name__, {
    "QuantConfig": "trtqat.quant.config", "QuantDescriptor": "trtqat.quant.descriptor",
    "collect_stats": "trtqat.quant.model_ops", "compute_amax": "trtqat.quant.model_ops",
    "quantize": "trtqat.quant.api", "quantize_": "trtqat.quant.api",
    "calibrate": "trtqat.quant.api", "describe": "trtqat.quant.placement",
    "QuantModuleReplacementHelper": _QM,
    "deactivate": _QM, "enable_onnx_export": _QM, "initialize": _QM,
    # the pipeline's verbs (trtqat.api): export, build, benchmark (torch-free), QAT recipe
    "export_onnx": "trtqat.api", "ExportResult": "trtqat.export.result",
    "build_engine": "trtqat.engines.registry", "benchmark": "trtqat.engines.bench",
    "BenchmarkResult": "trtqat.engines.timing", "qat_recipe": "trtqat.runs.qat_recipe",
    "QATRecipe": "trtqat.runs.qat_recipe",
}, submodules=("calib", "engines", "nn", "optim", "quant", "quant_modules", "tensor_quant",
               "utils"))

"""Fake-quantization core: descriptors, quantizers, Quant* modules and calibration.

The names below load on first access (torch with them), so that the torch-free parts of the
package (the calibration-method registry) import without torch.
"""

from trtqat.lazy import lazy_attributes

__all__ = [
    "QuantConfig", "QuantDescriptor", "TensorQuantizer", "calibrate", "collect_stats",
    "compute_amax", "describe", "quantize_",
    "disable_calibration", "disable_quantization", "enable_calibration", "enable_quantization",
    "fake_tensor_quant", "fake_tensor_quant_learnable", "name_quantizers", "quantize",
    "quantizers", "tensor_quant",
]

_OPS = "trtqat.quant.model_ops"
_FN = "trtqat.quant.functional"
__getattr__, __dir__ = lazy_attributes(__name__, {
    "QuantDescriptor": "trtqat.quant.descriptor",
    "TensorQuantizer": "trtqat.quant.tensor_quantizer",
    "fake_tensor_quant": _FN, "fake_tensor_quant_learnable": _FN, "tensor_quant": _FN,
    "QuantConfig": "trtqat.quant.config", "describe": "trtqat.quant.placement",
    **{name: "trtqat.quant.api" for name in ("calibrate", "quantize", "quantize_")},
    **{name: _OPS for name in (
        "collect_stats", "compute_amax", "disable_calibration", "disable_quantization",
        "enable_calibration", "enable_quantization", "name_quantizers", "quantizers")},
}, submodules=("amax", "api", "calib", "clip", "config", "descriptor", "export_mode",
               "fake_quant_op", "functional", "functional_layers", "kernel_loader", "mixin",
               "model_ops", "modules", "placement", "plugins", "pq_ops", "quant_modules",
               "tensor_quantizer"))

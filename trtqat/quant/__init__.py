"""Fake-quantization core: descriptors, quantizers, Quant* modules and calibration."""

from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.functional import fake_tensor_quant, fake_tensor_quant_learnable, tensor_quant
from trtqat.quant.model_ops import (
    QuantConfig,
    collect_stats,
    compute_amax,
    disable_calibration,
    disable_quantization,
    enable_calibration,
    enable_quantization,
    name_quantizers,
    quantize,
    quantizers,
)
from trtqat.quant.tensor_quantizer import TensorQuantizer

__all__ = [
    "QuantConfig", "QuantDescriptor", "TensorQuantizer", "collect_stats", "compute_amax",
    "disable_calibration", "disable_quantization", "enable_calibration", "enable_quantization",
    "fake_tensor_quant", "fake_tensor_quant_learnable", "name_quantizers", "quantize",
    "quantizers", "tensor_quant",
]

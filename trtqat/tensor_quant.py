"""pytorch-quantization's ``tensor_quant`` namespace: descriptors and quant functions."""

from trtqat.quant.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
    ScaledQuantDescriptor,
)
from trtqat.quant.functional import fake_tensor_quant_learnable
from trtqat.quant.pq_ops import (
    FakeAffineTensorQuantFunction,
    FakeTensorQuantFunction,
    LegacyFakeTensorQuantFunction,
    ScaledE4M3Function,
    TensorQuantFunction,
    fake_affine_tensor_quant,
    fake_tensor_quant,
    legacy_fake_tensor_quant,
    scaled_e4m3,
    tensor_quant,
)

__all__ = [
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW", "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR", "FakeAffineTensorQuantFunction", "FakeTensorQuantFunction",
    "LegacyFakeTensorQuantFunction", "QuantDescriptor", "ScaledE4M3Function",
    "ScaledQuantDescriptor", "TensorQuantFunction", "fake_affine_tensor_quant",
    "fake_tensor_quant", "fake_tensor_quant_learnable", "legacy_fake_tensor_quant",
    "scaled_e4m3", "tensor_quant",
]

"""QuantMatMul: a batched matmul whose two operands are fake-quantized per tensor.

Attention computes two activation-by-activation products (``Q @ K^T`` and ``P @ V``).
TensorRT fuses multi-head attention in INT8 only when *both* operands of each MatMul come
from a Q/DQ pair, so the module quantizes both; each operand has its own per-tensor range.
"""

from __future__ import annotations

import torch
from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.quant.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from trtqat.quant.tensor_quantizer import TensorQuantizer


class QuantMatMul(nn.Module):
    """``torch.matmul(input, other)`` with both operands fake-quantized.

    Args:
        quant_desc_input: descriptor of the left operand's quantizer.
        quant_desc_other: descriptor of the right operand's quantizer (default: the left's).

    Ranges must be per tensor: a per-channel activation range cannot be expressed by one
    TensorRT INT8 MatMul.
    """

    default_quant_desc_input: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    def __init__(self, quant_desc_input: QuantDescriptor | None = None,
                 quant_desc_other: QuantDescriptor | None = None) -> None:
        super().__init__()
        desc_a = quant_desc_input or type(self).default_quant_desc_input
        desc_b = quant_desc_other or desc_a
        for which, desc in (("quant_desc_input", desc_a), ("quant_desc_other", desc_b)):
            if not isinstance(desc, QuantDescriptor):
                raise TypeError(f"{which} must be a QuantDescriptor, got {type(desc).__name__}")
            if desc.axis is not None:
                raise QuantConfigError(
                    f"QuantMatMul {which} has axis={desc.axis}: matmul operands are quantized "
                    "per tensor (axis=None), as TensorRT INT8 MatMul requires"
                )
        self._input_quantizer = TensorQuantizer(desc_a)
        self._other_quantizer = TensorQuantizer(desc_b)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        """Quantizer of the left operand."""
        return self._input_quantizer

    @property
    def other_quantizer(self) -> TensorQuantizer:
        """Quantizer of the right operand."""
        return self._other_quantizer

    def forward(self, input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self._input_quantizer(input), self._other_quantizer(other))

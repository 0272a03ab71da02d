"""Mixins that give a float module its input (and weight) TensorQuantizer."""

from __future__ import annotations

from typing import Any

from torch import nn

from trtqat.quant.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from trtqat.quant.tensor_quantizer import TensorQuantizer


def pop_quant_desc(kwargs: dict[str, Any], cls: type) -> tuple[QuantDescriptor, QuantDescriptor | None]:
    """Take ``quant_desc_input`` / ``quant_desc_weight`` out of a module's kwargs."""
    desc_in = kwargs.pop("quant_desc_input", None) or cls.default_quant_desc_input
    desc_w = kwargs.pop("quant_desc_weight", None) or getattr(cls, "default_quant_desc_weight", None)
    return desc_in, desc_w


class QuantInputMixin:
    """A module that quantizes its input only (pooling)."""

    default_quant_desc_input: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor used for the input quantizer of modules built afterwards."""
        if not isinstance(value, QuantDescriptor):
            raise TypeError(f"expected a QuantDescriptor, got {type(value).__name__}")
        cls.default_quant_desc_input = value

    def init_quantizer(self, quant_desc_input: QuantDescriptor) -> None:
        self._input_quantizer = TensorQuantizer(quant_desc_input)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer


class QuantMixin(QuantInputMixin):
    """A module that quantizes its input and its weight (conv, linear)."""

    default_quant_desc_weight: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_weight(cls, value: QuantDescriptor) -> None:
        """Descriptor used for the weight quantizer of modules built afterwards."""
        if not isinstance(value, QuantDescriptor):
            raise TypeError(f"expected a QuantDescriptor, got {type(value).__name__}")
        cls.default_quant_desc_weight = value

    def init_quantizer(self, quant_desc_input: QuantDescriptor,  # type: ignore[override]
                       quant_desc_weight: QuantDescriptor) -> None:
        self._input_quantizer = TensorQuantizer(quant_desc_input)
        self._weight_quantizer = TensorQuantizer(quant_desc_weight)

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        return self._weight_quantizer


def copy_float_state(dst: nn.Module, src: nn.Module) -> None:
    """Copy parameters, buffers and plain attributes of a float module into its Quant twin."""
    for key, value in vars(src).items():
        if key.startswith("_") and key not in ("_reversed_padding_repeated_twice",):
            continue
        if key == "training":
            continue
        setattr(dst, key, value)
    dst.training = src.training
    for name, p in src._parameters.items():
        dst.register_parameter(name, p)
    for name, b in src._buffers.items():
        dst.register_buffer(name, b, persistent=name not in src._non_persistent_buffers_set)

"""Mixins that give a float module its input (and weight) TensorQuantizer."""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

from torch import nn

from trtqat.errors import QuantConfigError, QuantTypeError
from trtqat.quant.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from trtqat.quant.tensor_quantizer import TensorQuantizer

QUANT_KWARGS = ("quant_desc_input", "quant_desc_weight")


@functools.cache
def _float_kwargs(float_cls: type | None) -> frozenset[str]:
    if float_cls is None:
        return frozenset()
    return frozenset(inspect.signature(float_cls.__init__).parameters) - {"self"}


def split_quant_kwargs(kwargs: dict[str, Any], input_only: bool = False,
                       float_cls: type | None = None) -> dict[str, Any]:
    """Pop the quantization kwargs out of ``kwargs``.

    A keyword that is neither a quantization one nor an argument of ``float_cls`` (the float
    layer) raises TypeError, as pytorch-quantization's "Unused keys".
    """
    allowed = QUANT_KWARGS[:1] if input_only else QUANT_KWARGS
    quant = {k: kwargs.pop(k) for k in allowed if k in kwargs}
    unused = set(kwargs) - _float_kwargs(float_cls)
    if unused:
        raise QuantTypeError(f"Unused keys: {sorted(unused)}; quantized layers take "
                             f"{', '.join(allowed)} besides the float layer's arguments")
    return quant


def pop_quant_desc(kwargs: dict[str, Any], cls: type) -> tuple[QuantDescriptor, QuantDescriptor | None]:
    """Take ``quant_desc_input`` / ``quant_desc_weight`` out of a module's kwargs."""
    desc_in = kwargs.pop("quant_desc_input", None) or cls.default_quant_desc_input
    desc_w = kwargs.pop("quant_desc_weight", None) or getattr(cls, "default_quant_desc_weight", None)
    return desc_in, desc_w


def pop_quant_desc_in_kwargs(quant_cls: type, input_only: bool = False, **kwargs: Any):
    """pytorch-quantization's helper: the descriptors in ``kwargs`` or the class defaults.

    Returns ``quant_desc_input`` alone when ``input_only``, else ``(input, weight)``; any
    other keyword raises TypeError.
    """
    split_quant_kwargs(dict(kwargs), input_only)
    desc_in, desc_w = pop_quant_desc(kwargs, quant_cls)
    return desc_in if input_only else (desc_in, desc_w)


def _check_desc(value: Any) -> QuantDescriptor:
    if not isinstance(value, QuantDescriptor):
        raise QuantConfigError(f"{value!r} is not an instance of QuantDescriptor")
    return copy.deepcopy(value)


def _fake_only(*descs: QuantDescriptor) -> None:
    if not all(d.fake_quant for d in descs):
        raise QuantConfigError("Only fake quantization is supported in quantized layers: use "
                               "QuantDescriptor(fake_quant=True); real quantization is for "
                               "TensorQuantizer and tensor_quant")


def _input_quantizer_of(module) -> TensorQuantizer:
    return module._input_quantizer


class QuantMixin:
    """A module that quantizes its input and its weight (conv, linear, LSTM).

    As in pytorch-quantization, it is unrelated to :class:`QuantInputMixin` (programs branch
    on ``isinstance`` of one or the other); :data:`QUANT_LAYERS` names both.
    """

    default_quant_desc_input: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor used for the input quantizer of modules built afterwards."""
        cls.default_quant_desc_input = _check_desc(value)

    @classmethod
    def set_default_quant_desc_weight(cls, value: QuantDescriptor) -> None:
        """Descriptor used for the weight quantizer of modules built afterwards."""
        cls.default_quant_desc_weight = _check_desc(value)

    def init_quantizer(self, quant_desc_input: QuantDescriptor,
                       quant_desc_weight: QuantDescriptor, num_layers: int | None = None) -> None:
        """Create the input and weight quantizers (lists of ``num_layers`` when given)."""
        _fake_only(quant_desc_input, quant_desc_weight)
        self._fake_quant = True
        if num_layers is None:
            self._input_quantizer = TensorQuantizer(quant_desc_input)
            self._weight_quantizer = TensorQuantizer(quant_desc_weight)
        else:
            self._input_quantizers = nn.ModuleList(TensorQuantizer(quant_desc_input) for _ in range(num_layers))
            self._weight_quantizers = nn.ModuleList(TensorQuantizer(quant_desc_weight) for _ in range(num_layers))

    input_quantizer = property(_input_quantizer_of, doc="The input's TensorQuantizer.")

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        """The weight's TensorQuantizer."""
        return self._weight_quantizer


class QuantInputMixin:
    """A module that quantizes its input only (pooling, instance norm)."""

    default_quant_desc_input: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Descriptor used for the input quantizer of modules built afterwards."""
        cls.default_quant_desc_input = _check_desc(value)

    def init_quantizer(self, quant_desc_input: QuantDescriptor) -> None:
        """Create the input quantizer (ValueError for a descriptor with fake_quant=False)."""
        _fake_only(quant_desc_input)
        self._fake_quant = True
        self._input_quantizer = TensorQuantizer(quant_desc_input)

    input_quantizer = property(_input_quantizer_of, doc="The input's TensorQuantizer.")


# Every quantized layer: ``isinstance(m, QUANT_LAYERS)``.
QUANT_LAYERS = (QuantMixin, QuantInputMixin)


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

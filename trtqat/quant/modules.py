"""Quantized versions of torch.nn layers (drop-in subclasses of the float ones).

The per-dimension classes (``QuantConv1d`` .. ``QuantInstanceNorm3d``) are made by one
factory per kind from the float class of that dimension, ``torch.nn.<Kind><N>d``, and its
weight descriptor, ``QUANT_DESC_8BIT_<KIND><N>D_WEIGHT_PER_CHANNEL``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.quant import descriptor as qd
from trtqat.quant.mixin import (
    QuantInputMixin,
    QuantMixin,
    copy_float_state,
    pop_quant_desc,
    split_quant_kwargs,
)

DIMS = (1, 2, 3)
# The float class of each kind and dimension, captured before quant_modules.initialize() can
# replace them in torch.nn.
_FLOAT = {f"{kind}{d}d": getattr(nn, f"{kind}{d}d") for d in DIMS for kind in (
    "Conv", "ConvTranspose", "AvgPool", "AdaptiveAvgPool", "MaxPool", "InstanceNorm")}
_Linear = nn.Linear
_CONVT_FN = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _twin(cls: type, module: nn.Module, *descs: qd.QuantDescriptor | None) -> nn.Module:
    """An instance of the Quant* class ``cls`` sharing the float ``module``'s parameters and
    buffers, its quantizers made from ``descs``."""
    q = cls.__new__(cls)
    nn.Module.__init__(q)
    copy_float_state(q, module)
    q.init_quantizer(*descs)
    return q


class _QuantWeighted(QuantMixin):
    """Shared construction of the modules with a weight."""

    def _setup_quant(self, kwargs) -> None:
        desc_in, desc_w = pop_quant_desc(kwargs, type(self))
        self.init_quantizer(desc_in, desc_w)

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input=None, quant_desc_weight=None):
        """The Quant* twin of ``module`` sharing its parameters."""
        return _twin(cls, module, quant_desc_input or cls.default_quant_desc_input,
                     quant_desc_weight or cls.default_quant_desc_weight)


def _quant_conv_forward(self, input: torch.Tensor) -> torch.Tensor:
    return self._conv_forward(self._input_quantizer(input), self._weight_quantizer(self.weight),
                              self.bias)


def _quant_convt_forward(self, input: torch.Tensor,
                         output_size: list[int] | None = None) -> torch.Tensor:
    if self.padding_mode != "zeros":
        raise ValueError(f"Only 'zeros' padding mode is supported for {type(self).__name__}")
    dims = len(self.kernel_size)
    output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                          self.kernel_size, dims, self.dilation)
    return _CONVT_FN[dims](self._input_quantizer(input), self._weight_quantizer(self.weight),
                           self.bias, self.stride, self.padding, output_padding, self.groups,
                           self.dilation)


def _weighted_classes(kind: str, forward: Callable[..., torch.Tensor]) -> tuple[type, ...]:
    """``Quant<kind>1d..3d``: the float layer with quantized input and per-channel weight."""

    def make(d: int) -> type:
        base = _FLOAT[f"{kind}{d}d"]

        class QuantWeighted(base, _QuantWeighted):
            default_quant_desc_weight = getattr(
                qd, f"QUANT_DESC_8BIT_{kind.upper()}{d}D_WEIGHT_PER_CHANNEL")

            def __init__(self, *args, **kwargs):
                quant = split_quant_kwargs(kwargs, float_cls=base)
                super().__init__(*args, **kwargs)
                self._setup_quant(quant)

        QuantWeighted.forward = forward
        QuantWeighted.__name__ = QuantWeighted.__qualname__ = f"Quant{kind}{d}d"
        return QuantWeighted

    return tuple(make(d) for d in DIMS)


QuantConv1d, QuantConv2d, QuantConv3d = _weighted_classes("Conv", _quant_conv_forward)
QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d = _weighted_classes(
    "ConvTranspose", _quant_convt_forward)


class QuantLinear(_Linear, _QuantWeighted):
    """``nn.Linear`` with quantized input and per-row quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs):
        quant = split_quant_kwargs(kwargs, float_cls=_Linear)
        super().__init__(in_features, out_features, bias, **kwargs)
        self._setup_quant(quant)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias)


def _input_classes(kind: str) -> tuple[type, ...]:
    """``Quant<kind>1d..3d``: a layer that quantizes its input only (pooling, instance norm)."""

    def make(d: int) -> type:
        base = _FLOAT[f"{kind}{d}d"]

        class QuantPool(base, QuantInputMixin):
            def __init__(self, *args, **kwargs):
                desc_in = split_quant_kwargs(kwargs, True, base).get(
                    "quant_desc_input") or type(self).default_quant_desc_input
                super().__init__(*args, **kwargs)
                self.init_quantizer(desc_in)

            def forward(self, input: torch.Tensor) -> torch.Tensor:
                return super().forward(self._input_quantizer(input))

            @classmethod
            def from_float(cls, module: nn.Module, quant_desc_input=None, quant_desc_weight=None):
                return _twin(cls, module, quant_desc_input or cls.default_quant_desc_input)

        QuantPool.__name__ = QuantPool.__qualname__ = f"Quant{kind}{d}d"
        return QuantPool

    return tuple(make(d) for d in DIMS)


QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d = _input_classes("AvgPool")
QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d = _input_classes(
    "AdaptiveAvgPool")
QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d = _input_classes("MaxPool")
QuantInstanceNorm1d, QuantInstanceNorm2d, QuantInstanceNorm3d = _input_classes("InstanceNorm")

# float class -> Quant class, used by quantize() and quant_modules.initialize() (in this order)
FLOAT_TO_QUANT: dict[type, type] = {cls.__bases__[0]: cls for cls in (
    QuantConv1d, QuantConv2d, QuantConv3d,
    QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d,
    QuantLinear,
    QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d,
    QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d)}

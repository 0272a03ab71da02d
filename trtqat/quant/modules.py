"""Quantized versions of torch.nn layers (drop-in subclasses of the float ones)."""

from __future__ import annotations

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

# The float classes, captured before quant_modules.initialize() can replace them.
_Conv1d, _Conv2d, _Conv3d = nn.Conv1d, nn.Conv2d, nn.Conv3d
_ConvT1d, _ConvT2d, _ConvT3d = nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d
_Linear = nn.Linear


class _QuantWeighted(QuantMixin):
    """Shared construction of the modules with a weight."""

    def _setup_quant(self, kwargs) -> None:
        desc_in, desc_w = pop_quant_desc(kwargs, type(self))
        self.init_quantizer(desc_in, desc_w)

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input=None, quant_desc_weight=None):
        """The Quant* twin of ``module`` sharing its parameters."""
        q = cls.__new__(cls)
        nn.Module.__init__(q)
        copy_float_state(q, module)
        q.init_quantizer(quant_desc_input or cls.default_quant_desc_input,
                         quant_desc_weight or cls.default_quant_desc_weight)
        return q


def _conv_class(base, desc_w, name):
    class QuantConv(base, _QuantWeighted):
        default_quant_desc_weight = desc_w

        def __init__(self, *args, **kwargs):
            quant = split_quant_kwargs(kwargs, float_cls=base)
            super().__init__(*args, **kwargs)
            self._setup_quant(quant)

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return self._conv_forward(self._input_quantizer(input),
                                      self._weight_quantizer(self.weight), self.bias)

    QuantConv.__name__ = QuantConv.__qualname__ = name
    return QuantConv


QuantConv1d = _conv_class(_Conv1d, qd.QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL, "QuantConv1d")
QuantConv2d = _conv_class(_Conv2d, qd.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL, "QuantConv2d")
QuantConv3d = _conv_class(_Conv3d, qd.QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL, "QuantConv3d")

_CONVT_FN = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _convt_class(base, desc_w, dims, name):
    class QuantConvTranspose(base, _QuantWeighted):
        default_quant_desc_weight = desc_w

        def __init__(self, *args, **kwargs):
            quant = split_quant_kwargs(kwargs, float_cls=base)
            super().__init__(*args, **kwargs)
            self._setup_quant(quant)

        def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
            if self.padding_mode != "zeros":
                raise ValueError(f"Only 'zeros' padding mode is supported for {name}")
            output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                                  self.kernel_size, dims, self.dilation)
            return _CONVT_FN[dims](self._input_quantizer(input), self._weight_quantizer(self.weight),
                                   self.bias, self.stride, self.padding, output_padding,
                                   self.groups, self.dilation)

    QuantConvTranspose.__name__ = QuantConvTranspose.__qualname__ = name
    return QuantConvTranspose


QuantConvTranspose1d = _convt_class(_ConvT1d, qd.QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL, 1, "QuantConvTranspose1d")
QuantConvTranspose2d = _convt_class(_ConvT2d, qd.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL, 2, "QuantConvTranspose2d")
QuantConvTranspose3d = _convt_class(_ConvT3d, qd.QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL, 3, "QuantConvTranspose3d")


class QuantLinear(_Linear, _QuantWeighted):
    """``nn.Linear`` with quantized input and per-row quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs):
        quant = split_quant_kwargs(kwargs, float_cls=_Linear)
        super().__init__(in_features, out_features, bias, **kwargs)
        self._setup_quant(quant)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias)


def _pool_class(base, name):
    """A layer that quantizes its input only (pooling, instance norm)."""

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
            q = cls.__new__(cls)
            nn.Module.__init__(q)
            copy_float_state(q, module)
            q.init_quantizer(quant_desc_input or cls.default_quant_desc_input)
            return q

    QuantPool.__name__ = QuantPool.__qualname__ = name
    return QuantPool


QuantAvgPool1d = _pool_class(nn.AvgPool1d, "QuantAvgPool1d")
QuantAvgPool2d = _pool_class(nn.AvgPool2d, "QuantAvgPool2d")
QuantAvgPool3d = _pool_class(nn.AvgPool3d, "QuantAvgPool3d")
QuantAdaptiveAvgPool1d = _pool_class(nn.AdaptiveAvgPool1d, "QuantAdaptiveAvgPool1d")
QuantAdaptiveAvgPool2d = _pool_class(nn.AdaptiveAvgPool2d, "QuantAdaptiveAvgPool2d")
QuantAdaptiveAvgPool3d = _pool_class(nn.AdaptiveAvgPool3d, "QuantAdaptiveAvgPool3d")
QuantMaxPool1d = _pool_class(nn.MaxPool1d, "QuantMaxPool1d")
QuantMaxPool2d = _pool_class(nn.MaxPool2d, "QuantMaxPool2d")
QuantMaxPool3d = _pool_class(nn.MaxPool3d, "QuantMaxPool3d")
QuantInstanceNorm1d = _pool_class(nn.InstanceNorm1d, "QuantInstanceNorm1d")
QuantInstanceNorm2d = _pool_class(nn.InstanceNorm2d, "QuantInstanceNorm2d")
QuantInstanceNorm3d = _pool_class(nn.InstanceNorm3d, "QuantInstanceNorm3d")

# float class -> Quant class, used by quantize() and quant_modules.initialize()
FLOAT_TO_QUANT: dict[type, type] = {
    _Conv1d: QuantConv1d, _Conv2d: QuantConv2d, _Conv3d: QuantConv3d,
    _ConvT1d: QuantConvTranspose1d, _ConvT2d: QuantConvTranspose2d, _ConvT3d: QuantConvTranspose3d,
    _Linear: QuantLinear,
    nn.AvgPool1d: QuantAvgPool1d, nn.AvgPool2d: QuantAvgPool2d, nn.AvgPool3d: QuantAvgPool3d,
    nn.AdaptiveAvgPool1d: QuantAdaptiveAvgPool1d, nn.AdaptiveAvgPool2d: QuantAdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d: QuantAdaptiveAvgPool3d,
}

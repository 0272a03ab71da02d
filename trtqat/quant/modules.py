"""Quantized versions of torch.nn layers (drop-in subclasses of the float ones).

Every class is written out below: ``QuantConv2d`` is ``nn.Conv2d`` with a quantized input and
a per-channel quantized weight, ``QuantAvgPool2d`` is ``nn.AvgPool2d`` with a quantized
input, and so on. The shared behaviour lives in three bases: :class:`_QuantConvNd` and
:class:`_QuantConvTransposeNd` (input and weight quantizers) and :class:`_QuantInputNd`
(input quantizer only). :data:`FLOAT_TO_QUANT` is the one table of what ``quantize()`` and
``quant_modules.initialize()`` replace.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.quant import descriptor as qd
from trtqat.quant import lean_backward
from trtqat.quant.mixin import (
    QuantInputMixin,
    QuantMixin,
    copy_float_state,
    pop_quant_desc,
    split_quant_kwargs,
)


def _float_base(cls: type) -> type:
    """The torch.nn layer a Quant* class derives from (``nn.Conv2d`` for QuantConv2d)."""
    return next(base for base in cls.__mro__
                if base.__module__.startswith("torch.nn.") and issubclass(base, nn.Module))


_is_compiling = torch.compiler.is_compiling


@functools.cache
def _plain_conv_forward(cls: type) -> bool:
    """Whether ``cls`` keeps its float base's ``_conv_forward`` (the lean path replaces it)."""
    return cls._conv_forward is _float_base(cls)._conv_forward


def _twin(cls: type, module: nn.Module, *descs: qd.QuantDescriptor | None) -> nn.Module:
    """An instance of the Quant* class ``cls`` sharing the float ``module``'s parameters and
    buffers, its quantizers made from ``descs``."""
    q = cls.__new__(cls)
    nn.Module.__init__(q)
    copy_float_state(q, module)
    q.init_quantizer(*descs)
    return q


# --------------------------------------------------------------------------- bases
class _QuantWeighted(QuantMixin):
    """Construction of the layers with a weight: the float layer's arguments plus
    ``quant_desc_input`` / ``quant_desc_weight`` (the class defaults when absent)."""

    def __init__(self, *args, **kwargs) -> None:
        quant = split_quant_kwargs(kwargs, float_cls=_float_base(type(self)))
        super().__init__(*args, **kwargs)
        self.init_quantizer(*pop_quant_desc(quant, type(self)))

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input=None, quant_desc_weight=None):
        """The Quant* twin of ``module`` sharing its parameters."""
        return _twin(cls, module, quant_desc_input or cls.default_quant_desc_input,
                     quant_desc_weight or cls.default_quant_desc_weight)

    def _quant(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(quantized input, quantized weight)``, as pytorch-quantization's layers."""
        return self._input_quantizer(input), self._weight_quantizer(self.weight)


class _QuantConvNd(_QuantWeighted):
    """Convolution with quantized input and weight (in training, the lean-backward path of
    :mod:`.lean_backward` where it applies)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not _is_compiling() and _plain_conv_forward(type(self)):
            out = lean_backward.quant_conv(self, input)
            if out is not None:
                return out
        return self._conv_forward(self._input_quantizer(input),
                                  self._weight_quantizer(self.weight), self.bias)


_CONVT_FN = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class _QuantConvTransposeNd(_QuantWeighted):
    """Transposed convolution with quantized input and weight (zero padding only)."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for {type(self).__name__}")
        dims = len(self.kernel_size)
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, dims, self.dilation)
        x, w = self._quant(input)
        return _CONVT_FN[dims](x, w, self.bias, self.stride, self.padding, output_padding,
                               self.groups, self.dilation)


class _QuantInputNd(QuantInputMixin):
    """A layer that quantizes its input only, then runs the float layer's forward."""

    def __init__(self, *args, **kwargs) -> None:
        desc_in = split_quant_kwargs(kwargs, True, _float_base(type(self))).get(
            "quant_desc_input") or type(self).default_quant_desc_input
        super().__init__(*args, **kwargs)
        self.init_quantizer(desc_in)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(self._input_quantizer(input))

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input=None, quant_desc_weight=None):
        """The Quant* twin of ``module`` (``quant_desc_weight`` is ignored: no weight)."""
        return _twin(cls, module, quant_desc_input or cls.default_quant_desc_input)


# --------------------------------------------------------------------------- convolutions
class QuantConv1d(_QuantConvNd, nn.Conv1d):
    """``nn.Conv1d`` with quantized input and per-channel quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL


class QuantConv2d(_QuantConvNd, nn.Conv2d):
    """``nn.Conv2d`` with quantized input and per-channel quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL


class QuantConv3d(_QuantConvNd, nn.Conv3d):
    """``nn.Conv3d`` with quantized input and per-channel quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL


class QuantConvTranspose1d(_QuantConvTransposeNd, nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` with quantized input and per-channel quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL


class QuantConvTranspose2d(_QuantConvTransposeNd, nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` with quantized input and per-channel quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL


class QuantConvTranspose3d(_QuantConvTransposeNd, nn.ConvTranspose3d):
    """``nn.ConvTranspose3d`` with quantized input and per-channel quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL


# --------------------------------------------------------------------------- linear
class QuantLinear(_QuantWeighted, nn.Linear):
    """``nn.Linear`` with quantized input and per-row quantized weight."""

    default_quant_desc_weight = qd.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = lean_backward.quant_linear(self, input)
        if out is not None:
            return out
        return F.linear(self._input_quantizer(input), self._weight_quantizer(self.weight),
                        self.bias)


# --------------------------------------------------------------------------- pooling
class QuantAvgPool1d(_QuantInputNd, nn.AvgPool1d):
    """``nn.AvgPool1d`` with a quantized input."""


class QuantAvgPool2d(_QuantInputNd, nn.AvgPool2d):
    """``nn.AvgPool2d`` with a quantized input."""


class QuantAvgPool3d(_QuantInputNd, nn.AvgPool3d):
    """``nn.AvgPool3d`` with a quantized input."""


class QuantAdaptiveAvgPool1d(_QuantInputNd, nn.AdaptiveAvgPool1d):
    """``nn.AdaptiveAvgPool1d`` with a quantized input."""


class QuantAdaptiveAvgPool2d(_QuantInputNd, nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` with a quantized input."""


class QuantAdaptiveAvgPool3d(_QuantInputNd, nn.AdaptiveAvgPool3d):
    """``nn.AdaptiveAvgPool3d`` with a quantized input."""


class QuantMaxPool1d(_QuantInputNd, nn.MaxPool1d):
    """``nn.MaxPool1d`` with a quantized input."""


class QuantMaxPool2d(_QuantInputNd, nn.MaxPool2d):
    """``nn.MaxPool2d`` with a quantized input."""


class QuantMaxPool3d(_QuantInputNd, nn.MaxPool3d):
    """``nn.MaxPool3d`` with a quantized input."""


# --------------------------------------------------------------------------- normalization
class QuantInstanceNorm1d(_QuantInputNd, nn.InstanceNorm1d):
    """``nn.InstanceNorm1d`` with a quantized input."""


class QuantInstanceNorm2d(_QuantInputNd, nn.InstanceNorm2d):
    """``nn.InstanceNorm2d`` with a quantized input."""


class QuantInstanceNorm3d(_QuantInputNd, nn.InstanceNorm3d):
    """``nn.InstanceNorm3d`` with a quantized input."""


# --------------------------------------------------------------------------- the table
# float class -> Quant class: what quantize() and quant_modules.initialize() replace, in this
# order. Max pooling and instance norm are left alone by default, as in pytorch-quantization.
FLOAT_TO_QUANT: dict[type, type] = {
    nn.Conv1d: QuantConv1d,
    nn.Conv2d: QuantConv2d,
    nn.Conv3d: QuantConv3d,
    nn.ConvTranspose1d: QuantConvTranspose1d,
    nn.ConvTranspose2d: QuantConvTranspose2d,
    nn.ConvTranspose3d: QuantConvTranspose3d,
    nn.Linear: QuantLinear,
    nn.AvgPool1d: QuantAvgPool1d,
    nn.AvgPool2d: QuantAvgPool2d,
    nn.AvgPool3d: QuantAvgPool3d,
    nn.AdaptiveAvgPool1d: QuantAdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d: QuantAdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d: QuantAdaptiveAvgPool3d,
}

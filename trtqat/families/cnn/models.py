"""Classification models by name (torchvision), float or quantized.

Quantized models are built under ``quant_modules.initialize()``; torchvision ResNet blocks
also get a quantizer on the identity input of their Add, so TensorRT can fuse conv + add
and keep the block in INT8.
"""

from __future__ import annotations

import difflib

import torch
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from trtqat.errors import TrtqatError
from trtqat.quant import quant_modules
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.functional_layers import quantize_functional_layers
from trtqat.quant.model_ops import name_quantizers
from trtqat.quant.tensor_quantizer import TensorQuantizer

# Activations are calibrated with histograms: max, percentile, MSE and entropy all come from
# one collection pass.
QUANT_DESC_INPUT = QuantDescriptor(num_bits=8, calib_method="histogram")


class UnknownModelError(TrtqatError, ValueError):
    """The model name is not a torchvision classification model."""


def classification_models() -> list[str]:
    """Names of torchvision's classification models."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def _check_name(name: str) -> None:
    names = classification_models()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
        hint = (f"did you mean {', '.join(close)}?" if close
                else "see torchvision.models.list_models()")
        raise UnknownModelError(f"unknown model {name!r}: {hint}")


class _QuantResidual:
    """Forward of a torchvision residual block with the identity input quantized."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        if isinstance(self, Bottleneck):
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
        else:
            out = self.bn2(self.conv2(out))
        out = out + self.residual_quantizer(identity)
        return self.relu(out)


class QuantBasicBlock(_QuantResidual, BasicBlock):
    """torchvision BasicBlock with a quantized residual input."""


class QuantBottleneck(_QuantResidual, Bottleneck):
    """torchvision Bottleneck with a quantized residual input."""


def add_residual_quantizers(model: nn.Module,
                            quant_desc: QuantDescriptor = QUANT_DESC_INPUT) -> int:
    """Give every torchvision ResNet block a quantizer on its identity input; returns the count."""
    count = 0
    for module in model.modules():
        if type(module) in (BasicBlock, Bottleneck):
            module.__class__ = QuantBasicBlock if type(module) is BasicBlock else QuantBottleneck
            module.residual_quantizer = TensorQuantizer(quant_desc)
            count += 1
    return count


def build_model(name: str, num_classes: int, quantized: bool = False,
                quant_desc_input: QuantDescriptor = QUANT_DESC_INPUT) -> nn.Module:
    """A randomly initialised torchvision classification model, float or fake-quantized."""
    _check_name(name)
    if num_classes < 2:
        raise TrtqatError(f"--num-classes must be >= 2, got {num_classes}")
    if not quantized:
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    from trtqat.quant.modules import FLOAT_TO_QUANT

    classes = tuple(FLOAT_TO_QUANT.values())
    saved = [c.default_quant_desc_input for c in classes]
    for c in classes:
        c.default_quant_desc_input = quant_desc_input
    try:
        with quant_modules.initialized():
            model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    finally:
        for c, d in zip(classes, saved):
            c.default_quant_desc_input = d
    add_residual_quantizers(model, quant_desc_input)
    quantize_functional_layers(model)  # Swin attention calls F.linear on its layers' weights
    name_quantizers(model)
    return model

"""pytorch-quantization's ``nn`` namespace: TensorQuantizer and the Quant* layers."""

from trtqat.quant.modules import (
    QuantAdaptiveAvgPool1d,
    QuantAdaptiveAvgPool2d,
    QuantAdaptiveAvgPool3d,
    QuantAvgPool1d,
    QuantAvgPool2d,
    QuantAvgPool3d,
    QuantConv1d,
    QuantConv2d,
    QuantConv3d,
    QuantConvTranspose1d,
    QuantConvTranspose2d,
    QuantConvTranspose3d,
    QuantLinear,
    QuantMaxPool1d,
    QuantMaxPool2d,
    QuantMaxPool3d,
)
from trtqat.quant.tensor_quantizer import TensorQuantizer

Conv1d, Conv2d, Conv3d = QuantConv1d, QuantConv2d, QuantConv3d
ConvTranspose1d, ConvTranspose2d, ConvTranspose3d = QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d
Linear = QuantLinear
AvgPool1d, AvgPool2d, AvgPool3d = QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d
MaxPool1d, MaxPool2d, MaxPool3d = QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d
AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d = (
    QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d)

__all__ = [
    "TensorQuantizer", "QuantConv1d", "QuantConv2d", "QuantConv3d", "QuantConvTranspose1d",
    "QuantConvTranspose2d", "QuantConvTranspose3d", "QuantLinear", "QuantAvgPool1d",
    "QuantAvgPool2d", "QuantAvgPool3d", "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d",
    "QuantAdaptiveAvgPool3d", "QuantMaxPool1d", "QuantMaxPool2d", "QuantMaxPool3d",
]

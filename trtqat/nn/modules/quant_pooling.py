"""``nn.modules.quant_pooling``: pooling layers with a quantized input, and short aliases."""

from trtqat.quant.modules import (
    QuantAdaptiveAvgPool1d,
    QuantAdaptiveAvgPool2d,
    QuantAdaptiveAvgPool3d,
    QuantAvgPool1d,
    QuantAvgPool2d,
    QuantAvgPool3d,
    QuantMaxPool1d,
    QuantMaxPool2d,
    QuantMaxPool3d,
)

MaxPool1d, MaxPool2d, MaxPool3d = QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d
AvgPool1d, AvgPool2d, AvgPool3d = QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d
AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d = (
    QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d)

__all__ = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AvgPool1d",
           "AvgPool2d", "AvgPool3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
           "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d", "QuantAdaptiveAvgPool3d",
           "QuantAvgPool1d", "QuantAvgPool2d", "QuantAvgPool3d", "QuantMaxPool1d",
           "QuantMaxPool2d", "QuantMaxPool3d"]

"""pytorch-quantization's ``nn`` namespace: TensorQuantizer, Clip and the Quant* layers."""

from trtqat.nn import functional
from trtqat.nn.modules.clip import Clip
from trtqat.nn.modules.quant_conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    QuantConv1d,
    QuantConv2d,
    QuantConv3d,
    QuantConvTranspose1d,
    QuantConvTranspose2d,
    QuantConvTranspose3d,
)
from trtqat.nn.modules.quant_instancenorm import (
    QuantInstanceNorm1d,
    QuantInstanceNorm2d,
    QuantInstanceNorm3d,
)
from trtqat.nn.modules.quant_linear import Linear, QuantLinear
from trtqat.nn.modules.quant_pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
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
from trtqat.nn.modules.quant_rnn import LSTM, LSTMCell, QuantLSTM, QuantLSTMCell
from trtqat.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = [
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AvgPool1d", "AvgPool2d",
    "AvgPool3d", "Clip", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "LSTM", "LSTMCell", "Linear", "MaxPool1d", "MaxPool2d", "MaxPool3d",
    "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d", "QuantAdaptiveAvgPool3d",
    "QuantAvgPool1d", "QuantAvgPool2d", "QuantAvgPool3d", "QuantConv1d", "QuantConv2d",
    "QuantConv3d", "QuantConvTranspose1d", "QuantConvTranspose2d", "QuantConvTranspose3d",
    "QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d", "QuantLSTM",
    "QuantLSTMCell", "QuantLinear",
    "QuantMaxPool1d", "QuantMaxPool2d", "QuantMaxPool3d", "TensorQuantizer", "functional",
]

"""``nn.modules.quant_conv``: quantized convolutions and their short aliases."""

from trtqat.quant.modules import (
    QuantConv1d,
    QuantConv2d,
    QuantConv3d,
    QuantConvTranspose1d,
    QuantConvTranspose2d,
    QuantConvTranspose3d,
)

Conv1d, Conv2d, Conv3d = QuantConv1d, QuantConv2d, QuantConv3d
ConvTranspose1d, ConvTranspose2d, ConvTranspose3d = (
    QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d)

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "QuantConv1d", "QuantConv2d", "QuantConv3d", "QuantConvTranspose1d",
           "QuantConvTranspose2d", "QuantConvTranspose3d"]

"""A tiny calibrated quantized CNN, shared by the accelerator and CUDA-graph tests."""

from __future__ import annotations

import torch
from torch import nn

import trtqat
from trtqat.quant.modules import QuantConv2d, QuantLinear


def tiny_qcnn() -> nn.Module:
    """A calibrated conv-BN-ReLU-pool-linear model with quantized inputs and weights."""
    torch.manual_seed(0)
    model = nn.Sequential(QuantConv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), QuantLinear(8, 4))
    trtqat.collect_stats(model, [torch.randn(8, 3, 16, 16)], progress=False)
    trtqat.compute_amax(model, "max")
    return model

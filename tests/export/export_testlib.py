"""Test helpers of tests/export: a tiny quantized residual CNN, data, calibration."""

from __future__ import annotations

import torch
from torch import nn

from trtqat.quant import QuantDescriptor, TensorQuantizer, collect_stats, compute_amax, quantize
from trtqat.quant.model_ops import name_quantizers, quantizers

MAX_CALIB = QuantDescriptor(num_bits=8)  # max calibration: one pass, exact and fast


class TinyResNet(nn.Module):
    """conv-bn-relu, maxpool, one residual block with a quantized identity, avgpool, fc."""

    def __init__(self, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        y = self.relu(self.bn2(self.conv2(x)))
        y = self.bn3(self.conv3(y))
        identity = self.residual_quantizer(x) if hasattr(self, "residual_quantizer") else x
        x = self.relu(y + identity)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def batches(n: int = 4, size: int = 16, batch: int = 16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, size, size, generator=g) for _ in range(n)]


def settle_batchnorm(model: nn.Module, data: list[torch.Tensor]) -> None:
    """Running statistics from ``data`` (quantizers off), as a trained model would have."""
    qs = [q for _, q in quantizers(model)]
    for q in qs:
        q.disable()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    model.train()
    with torch.no_grad():
        for x in data:
            model(x)
    model.eval()
    for q in qs:
        q.enable()


def calibrate(model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    collect_stats(model, data, progress=False)
    compute_amax(model, "max")
    return model


def make_tiny(quantized: bool = True, calibrated: bool = True, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = TinyResNet()
    data = batches(seed=seed)
    if quantized:
        from trtqat.quant.model_ops import QuantConfig

        quantize(model, QuantConfig(quant_desc_input=MAX_CALIB))
        model.residual_quantizer = TensorQuantizer(MAX_CALIB)
        name_quantizers(model)
    settle_batchnorm(model, data)
    if quantized and calibrated:
        calibrate(model, data)
    return model

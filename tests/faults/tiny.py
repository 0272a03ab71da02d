"""A tiny classifier and the trtqat commands the fault tests run on it."""

from __future__ import annotations

from pathlib import Path

from torch import nn


def tiny_model(name: str, num_classes: int, quantized: bool = False) -> nn.Module:
    """Conv-BN-ReLU-pool-Linear: stands in for ``build_model`` (fp32 training only)."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))


def train_argv(out: Path, *extra: str, epochs: int = 1) -> list[str]:
    """``trtqat train`` of the tiny model on synthetic 16 px images, two batches an epoch."""
    return ["train", "--model", "resnet18", "--data", "synthetic", "--image-size", "16",
            "--batch-size", "8", "--limit-batches", "2", "--epochs", str(epochs), "--lr", "0.01",
            "--warmup-epochs", "0", "--no-progress", "--out", str(out), *extra]

"""A few optimizer steps on a loss, shared by the QAT tests of the quantization formats."""

from __future__ import annotations

from collections.abc import Callable

import torch


def fit(loss_of: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer,
        steps: int) -> list[float]:
    """Run ``steps`` steps of ``optimizer`` on ``loss_of()``; return each step's loss."""
    losses = []
    for _ in range(steps):
        loss = loss_of()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses

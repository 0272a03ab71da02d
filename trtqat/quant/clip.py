"""Clip with broadcasting and PACT-style gradients for learnable bounds (``nn.functional.clip``,
``nn.modules.clip.Clip``)."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from torch import nn

from trtqat.errors import QuantConfigError


class ClipFunction(torch.autograd.Function):
    """``min(max(x, lo), hi)`` with tensor bounds.

    Gradients: ``x`` gets the incoming gradient where it lies strictly inside the bounds; a
    bound that requires grad gets the sum of the gradient of the elements clipped to it
    (PACT). Learnable bounds must be scalars.
    """

    @staticmethod
    def forward(ctx, inputs, clip_value_min, clip_value_max):  # type: ignore[override]
        lo = torch.as_tensor(clip_value_min, dtype=inputs.dtype, device=inputs.device)
        hi = torch.as_tensor(clip_value_max, dtype=inputs.dtype, device=inputs.device)
        ctx.save_for_backward(inputs, lo, hi)
        return torch.max(torch.min(inputs, hi), lo)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        inputs, lo, hi = ctx.saved_tensors
        above_lo = (inputs > lo).to(grad.dtype)
        below_hi = (inputs < hi).to(grad.dtype)
        learn_min, learn_max = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if (learn_min or learn_max) and (lo.numel() != 1 or hi.numel() != 1):
            raise QuantConfigError(f"learnable clip bounds must be scalars, got sizes "
                                   f"{tuple(lo.shape)} and {tuple(hi.shape)}")
        g_min = (grad * (1.0 - above_lo)).sum().reshape(lo.shape) if learn_min else None
        g_max = (grad * (1.0 - below_hi)).sum().reshape(hi.shape) if learn_max else None
        return grad * above_lo * below_hi, g_min, g_max


def clip(inputs: torch.Tensor, clip_value_min, clip_value_max) -> torch.Tensor:
    """Clip ``inputs`` to ``[clip_value_min, clip_value_max]`` (numbers or broadcastable tensors)."""
    return ClipFunction.apply(inputs, clip_value_min, clip_value_max)


def _learnable(value, which: str) -> nn.Parameter:
    # as in pytorch-quantization: a Python number or a one-element ndarray; a torch tensor is
    # refused (pass float(t))
    scalar = (isinstance(value, numbers.Real) and not isinstance(value, bool)) or (
        isinstance(value, np.ndarray) and value.size == 1)
    if not scalar:
        raise QuantConfigError(f"{which} must be scalar (a float) to initialise a learnable "
                               f"range, got {value!r}")
    return nn.Parameter(torch.tensor(float(value)))


class Clip(nn.Module):
    """Clip a tensor to ``[clip_value_min, clip_value_max]``; either bound may be learned.

    Args:
        clip_value_min, clip_value_max: numbers or tensors (scalars when learned).
        learn_min, learn_max: make the bound an ``nn.Parameter`` initialised from the value.

    Raises:
        ValueError: a learned bound that is not a scalar.
    """

    def __init__(self, clip_value_min, clip_value_max, learn_min: bool = False,
                 learn_max: bool = False) -> None:
        super().__init__()
        self.clip_value_min = _learnable(clip_value_min, "clip_value_min") if learn_min else clip_value_min
        self.clip_value_max = _learnable(clip_value_max, "clip_value_max") if learn_max else clip_value_max

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` clipped to the bounds."""
        return clip(inputs, self.clip_value_min, self.clip_value_max)

"""Elementwise fake-quant kernels: one pass for the forward value, one for the backward mask.

This module is the pure-PyTorch implementation; a compiled kernel replaces it when present.
Both compute, with ``scale = amax / qmax`` and round-half-to-even (as ONNX QuantizeLinear):

    y    = clamp(round(x / scale), qmin, qmax) * scale
    mask = qmin <= round(x / scale) <= qmax          (straight-through gradient)

``amax`` is a float32 tensor broadcastable to ``x`` (0-d per tensor, keep-dim per channel).
Inputs of any float dtype are computed in float32 and returned in their own dtype.
"""

from __future__ import annotations

import torch

# A scale may not be 0 (a channel whose calibrated range is 0 holds only zeros).
_MIN_SCALE = torch.finfo(torch.float32).tiny


def scale_of(amax: torch.Tensor, qmax: int) -> torch.Tensor:
    """Quantization step for ``amax`` (float32, never 0): ``amax / qmax`` by IEEE division.

    On CUDA torch divides by a Python number as a product with its rounded reciprocal, which
    can differ in the last bit (and move a tie by one code); a tensor divisor divides exactly,
    as on the CPU, in the Triton kernels and in ONNX Runtime's QuantizeLinear.
    """
    a = amax.float()
    if a.is_cuda:
        return (a / torch.full((), float(qmax), device=a.device)).clamp_min(_MIN_SCALE)
    return (a / qmax).clamp_min(_MIN_SCALE)


def fake_quant_forward(
    x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> tuple[torch.Tensor, bool | None]:
    """Fake-quantize ``x``; also say whether any element was clipped (None: unknown)."""
    scale = scale_of(amax, qmax)
    q = (x.float() / scale).round_().clamp_(qmin, qmax)  # one new tensor, updated in place
    return q.mul_(scale).to(x.dtype), None


def fake_quant_grad_input(
    grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """``grad`` where ``x`` was not clipped, 0 elsewhere."""
    q = (x.float() / scale_of(amax, qmax)).round_()
    return grad * ((q >= qmin) & (q <= qmax)).to(grad.dtype)



def learnable_grad(
    grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_x, grad_amax)`` of fake quantization with a learned ``amax`` (LSQ-style).

    ``grad_x`` is the straight-through gradient; ``d y / d amax`` is ``(round(q) - q) / qmax``
    inside the range and ``qmin / qmax`` or ``qmax / qmax`` outside, summed over the
    dimensions ``amax`` broadcasts along.
    """
    scale = scale_of(amax.detach(), qmax)
    q = x.float() / scale
    r = torch.round(q)
    inside = (r >= qmin) & (r <= qmax)
    g = grad.float()
    grad_x = (g * inside).to(grad.dtype)
    local = torch.where(inside, (r - q) / qmax, r.clamp(qmin, qmax) / qmax)
    grad_amax = g * local
    reduce_dims = [d for d in range(x.dim()) if amax.dim() != x.dim() or amax.shape[d] == 1]
    if amax.dim() == 0:
        grad_amax = grad_amax.sum()
    else:
        grad_amax = grad_amax.sum(dim=reduce_dims, keepdim=True).reshape(amax.shape)
    return grad_x, grad_amax.to(amax.dtype)


BACKEND = "pytorch"

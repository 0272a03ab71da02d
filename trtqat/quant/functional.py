"""Functional fake quantization with straight-through gradients.

``fake_tensor_quant`` is the hot path of QAT: one fused pass forward, and a backward that
costs nothing when no element was clipped. ``fake_tensor_quant_learnable`` also returns the
gradient of ``amax`` (LSQ-style straight-through estimate).
"""

from __future__ import annotations

import torch

from trtqat.quant import _kernels


def quant_bounds(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[int, int]:
    """Integer range ``(qmin, qmax)`` for the given format."""
    qmax = 2 ** (num_bits - 1 + int(unsigned)) - 1
    if unsigned:
        return 0, qmax
    return (-qmax if narrow_range else -qmax - 1), qmax


class _FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, amax, qmin, qmax):  # type: ignore[override]
        y, clipped = _kernels.fake_quant_forward(x, amax, qmin, qmax)
        ctx.qbounds = (qmin, qmax)
        ctx.passthrough = clipped is False  # nothing clipped: the gradient is the identity
        if ctx.passthrough:
            ctx.save_for_backward()
        else:
            ctx.save_for_backward(x, amax)
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.passthrough:
            return grad, None, None, None
        x, amax = ctx.saved_tensors
        qmin, qmax = ctx.qbounds
        return _kernels.fake_quant_grad_input(grad, x, amax, qmin, qmax), None, None, None


class _FakeQuantLearnable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, amax, qmin, qmax):  # type: ignore[override]
        ctx.save_for_backward(x, amax)
        ctx.qbounds = (qmin, qmax)
        y, _ = _kernels.fake_quant_forward(x, amax.detach(), qmin, qmax)
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, amax = ctx.saved_tensors
        qmin, qmax = ctx.qbounds
        scale = _kernels.scale_of(amax.detach(), qmax)
        q = x.float() / scale
        r = torch.round(q)
        inside = (r >= qmin) & (r <= qmax)
        g = grad.float()
        grad_x = (g * inside).to(grad.dtype)
        # d y / d amax: (round(q) - q) / qmax inside the range, qmin/qmax or qmax/qmax outside.
        local = torch.where(inside, (r - q) / qmax, r.clamp(qmin, qmax) / qmax)
        grad_amax = g * local
        reduce_dims = [d for d in range(x.dim()) if amax.dim() != x.dim() or amax.shape[d] == 1]
        if amax.dim() == 0:
            grad_amax = grad_amax.sum()
        else:
            grad_amax = grad_amax.sum(dim=reduce_dims, keepdim=True).reshape(amax.shape)
        return grad_x, grad_amax.to(amax.dtype), None, None


def _as_amax(amax: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(amax, torch.Tensor):
        amax = torch.tensor(float(amax), device=like.device)
    return amax


def fake_tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Quantize then dequantize ``inputs`` with range ``amax`` (straight-through gradient).

    ``amax`` is a scalar or a tensor broadcastable to ``inputs`` (per-channel ranges keep
    their dimensions, e.g. shape ``(C, 1, 1, 1)`` for conv weights). No gradient flows to
    ``amax``; use :func:`fake_tensor_quant_learnable` for that.
    """
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    return _FakeQuant.apply(inputs, _as_amax(amax, inputs).detach(), qmin, qmax)


def fake_tensor_quant_learnable(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Like :func:`fake_tensor_quant`, and ``amax`` receives its straight-through gradient."""
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    return _FakeQuantLearnable.apply(inputs, amax, qmin, qmax)


def tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``inputs``: returns ``(integers as float tensor, scale)``.

    As in pytorch-quantization, ``scale = qmax / amax`` and ``inputs ~= outputs / scale``.
    """
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    amax = _as_amax(amax, inputs).detach()
    step = _kernels.scale_of(amax, qmax)
    outputs = torch.round(inputs.float() / step).clamp_(qmin, qmax).to(inputs.dtype)
    return outputs, (1.0 / step)

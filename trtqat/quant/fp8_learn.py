"""A learned FP8 E4M3 range: :func:`trtqat.quant.fp8.fake_e4m3` with an LSQ-style gradient
for ``amax`` (``TensorQuantizer.init_learn_amax`` makes amax a parameter; encoder QAT learns
its activation ranges so). The quantizer calls :func:`fake_e4m3_any`.

With ``s = amax / 448`` and ``y = s * e4m3(x / s)``: inside the range the rounding passes
straight through, so ``dy/damax = (e4m3(x / s) - x / s) / 448``; a clipped element is
``+-448 s``, so ``dy/damax = sign(x)``. The input's gradient is :func:`fake_e4m3`'s (it passes
where ``|x| <= amax``). The forward is exactly :func:`fake_e4m3`'s.
"""

from __future__ import annotations

import torch

from trtqat.quant.fp8 import E4M3_MAX, fake_e4m3, fp8_scale, quantize_e4m3


class _FakeE4M3Learnable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, amax):  # type: ignore[override]
        ctx.save_for_backward(inputs, amax)
        scale = fp8_scale(amax)
        return (quantize_e4m3(inputs, scale).float() * scale).to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        inputs, amax = ctx.saved_tensors
        scale = fp8_scale(amax)
        x = inputs.float()
        inside = x.abs() <= amax.float()
        steps = quantize_e4m3(x, scale).float() - x / scale
        d_amax = torch.where(inside, steps / E4M3_MAX, torch.sign(x))
        grad_amax = (grad.float() * d_amax).sum_to_size(amax.shape) if amax.dim() else (
            (grad.float() * d_amax).sum().reshape(amax.shape))
        grad_in = torch.where(inside, grad, torch.zeros_like(grad))
        return grad_in, grad_amax.to(amax.dtype)


def fake_e4m3_learnable(inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 quantize-dequantize of ``inputs`` whose ``amax`` (a trained parameter, per
    tensor or broadcastable) also gets a gradient; ``|amax|``, at least 1e-8, is used."""
    return _FakeE4M3Learnable.apply(inputs, amax.abs().clamp_min(1e-8))


def fake_e4m3_any(inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """:func:`fake_e4m3_learnable` for an ``amax`` that requires grad (a learned range),
    :func:`trtqat.quant.fp8.fake_e4m3` (amax fixed) otherwise."""
    if amax.requires_grad:
        return fake_e4m3_learnable(inputs, amax)
    return fake_e4m3(inputs, amax)

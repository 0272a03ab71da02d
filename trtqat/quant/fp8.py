"""FP8 E4M3 fake quantization as ONNX's ``QuantizeLinear``/``DequantizeLinear`` compute it.

The scale is ``amax / 448`` (float32), the code ``saturate(round_half_even(x / scale))`` in
E4M3 (finite values only, +-448 at most) and the output ``code * scale``: the same float32
operations, in the same order, as ONNX Runtime's FP8 Q/DQ kernels, so the exported file
reproduces the PyTorch model's quantized values bit for bit. (pytorch-quantization's
``scaled_e4m3`` multiplies by ``448 / amax`` instead; :func:`trtqat.tensor_quant.scaled_e4m3`
keeps that for its callers.) The gradient passes where ``|x| <= amax`` (straight-through).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The Q/DQ scale of ``amax`` (float32; an amax of 0 gets scale 1, all codes 0)."""
    amax = amax.float()
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``QuantizeLinear(x, scale, fp8 zero)``: the E4M3 codes (dtype float8_e4m3fn)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class _FakeE4M3(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, amax):  # type: ignore[override]
        scale = fp8_scale(amax)
        ctx.save_for_backward(inputs, amax)
        return (quantize_e4m3(inputs, scale).float() * scale).to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        inputs, amax = ctx.saved_tensors
        inside = inputs.abs() <= amax.to(inputs.dtype)
        return torch.where(inside, grad, torch.zeros_like(grad)), None


def fake_e4m3(inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 quantize-dequantize of ``inputs`` with ``amax`` (per tensor, or any shape
    that broadcasts: per channel) mapping to 448, in ``inputs``' dtype."""
    return _FakeE4M3.apply(inputs, amax.detach())

"""pytorch-quantization's functional quantizers: tensor_quant, fake_tensor_quant,
legacy_fake_tensor_quant, fake_affine_tensor_quant and scaled_e4m3.

Same arguments, defaults (``narrow_range=True`` at this level, as there), results and
exceptions: a negative amax raises ValueError, a negative input to an unsigned quantizer
raises TypeError. An amax of 0 quantizes to 0. The int8 fake quantization itself is
:func:`trtqat.quant.functional.fake_tensor_quant` (the fused training kernel).
"""

from __future__ import annotations

import torch

from trtqat.errors import QuantConfigError, QuantTypeError
from trtqat.quant import functional

# amax at or below this counts as 0 (the smallest fp16 subnormal), as in pytorch-quantization
_ZERO_AMAX = 1.0 / (1 << 24)
E4M3_MAX = 448.0


def _amax_tensor(amax: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    if isinstance(amax, torch.Tensor):
        return amax.detach().float()
    if isinstance(amax, (int, float)) and not isinstance(amax, bool):
        return torch.tensor(float(amax), device=like.device)
    raise QuantTypeError(f"amax must be a tensor or a number, got {type(amax).__name__}")


def _check(inputs: torch.Tensor, amax: torch.Tensor, unsigned: bool) -> None:
    if amax.numel() and bool((amax < 0).any()):
        raise QuantConfigError("Negative values in amax: amax is a magnitude and must be >= 0")
    if unsigned and inputs.numel() and bool(inputs.min() < 0):
        raise QuantTypeError("Negative values encountered in unsigned quantization: quantize "
                             "a non-negative tensor (e.g. after ReLU) or use unsigned=False")


def _bounds(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[float, float]:
    qmin, qmax = functional.quant_bounds(num_bits, unsigned, narrow_range)
    return float(qmin), float(qmax)


def _quant(inputs, amax, num_bits, unsigned, narrow_range):
    """Integer codes (in float) and ``scale = maxbound / amax`` (1 where amax is 0)."""
    qmin, qmax = _bounds(num_bits, unsigned, narrow_range)
    zero = amax <= _ZERO_AMAX
    scale = torch.where(zero, torch.zeros_like(amax), qmax / torch.where(zero, 1.0, amax))
    codes = torch.clamp(torch.round(inputs.float() * scale), qmin, qmax)
    return codes, torch.where(zero, torch.ones_like(scale), scale)


def _ste(grad, inputs, amax):
    return torch.where(inputs.abs() <= amax, grad, torch.zeros_like(grad))


def _saved(ctx, inputs: torch.Tensor, amax, unsigned: bool) -> torch.Tensor:
    """amax as a tensor, checked against ``inputs``; both saved for the backward."""
    amax = _amax_tensor(amax, inputs)
    _check(inputs, amax, unsigned)
    ctx.save_for_backward(inputs, amax)
    return amax


class TensorQuantFunction(torch.autograd.Function):
    """Quantize to integer codes (held in the input's float dtype) and return the scale."""

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):  # type: ignore[override]
        amax = _saved(ctx, inputs, amax, unsigned)
        codes, scale = _quant(inputs, amax, num_bits, unsigned, narrow_range)
        if inputs.dtype == torch.half and bool(scale.max() > torch.finfo(torch.half).max):
            raise QuantConfigError(f"scale is too large for FP16 with amax={amax.min().item():g}: "
                                   "quantize in float32 or use a larger amax")
        return codes.to(inputs.dtype), scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs, grad_scale):  # type: ignore[override]
        inputs, amax = ctx.saved_tensors
        return _ste(grad_outputs, inputs, amax), None, None, None, None


class FakeTensorQuantFunction(torch.autograd.Function):
    """Quantize-dequantize with the fused kernel: pytorch-quantization's class behind
    ``fake_tensor_quant`` (``FakeTensorQuantFunction.apply(inputs, amax, num_bits, unsigned,
    narrow_range)``). Straight-through gradient where ``|x| <= amax``; none for amax."""

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):  # type: ignore[override]
        amax = _saved(ctx, inputs, amax, unsigned)
        return functional.fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)

    @staticmethod
    def backward(ctx, grad_outputs):  # type: ignore[override]
        inputs, amax = ctx.saved_tensors
        return _ste(grad_outputs, inputs, amax), None, None, None, None


class LegacyFakeTensorQuantFunction(FakeTensorQuantFunction):
    """Quantize-dequantize in plain PyTorch (``codes / scale``); the same straight-through
    backward as :class:`FakeTensorQuantFunction`."""

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):  # type: ignore[override]
        amax = _saved(ctx, inputs, amax, unsigned)
        codes, scale = _quant(inputs, amax, num_bits, unsigned, narrow_range)
        return (codes / scale).to(inputs.dtype)


class FakeAffineTensorQuantFunction(torch.autograd.Function):
    """Asymmetric (scale + zero-point) fake quantization of ``[min_range, max_range]``."""

    @staticmethod
    def forward(ctx, inputs, min_range, max_range, num_bits=8):  # type: ignore[override]
        min_range, max_range = _amax_tensor(min_range, inputs), _amax_tensor(max_range, inputs)
        ctx.save_for_backward(inputs, min_range, max_range)
        step = (max_range - min_range) / (2.0 ** num_bits - 1)
        lo, hi = -(2.0 ** (num_bits - 1)), 2.0 ** (num_bits - 1) - 1
        zero_point = torch.round(min_range / step) - lo
        codes = torch.clamp(torch.round(inputs / step) - zero_point, lo, hi)
        return ((codes + zero_point) * step).to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs):  # type: ignore[override]
        inputs, min_range, max_range = ctx.saved_tensors
        inside = (inputs >= min_range) & (inputs <= max_range)
        return torch.where(inside, grad_outputs, torch.zeros_like(grad_outputs)), None, None, None


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP8 E4M3 value (saturating at +-448), in ``x``'s dtype."""
    y = x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    return y.to(x.dtype)


class ScaledE4M3Function(torch.autograd.Function):
    """FP8 E4M3 fake quantization; ``amax`` (scalar or broadcastable) maps to 448."""

    @staticmethod
    def forward(ctx, inputs, amax=None, E=4, M=3):  # type: ignore[override]
        if (E, M) != (4, 3):
            raise NotImplementedError("only E=4, M=3 (E4M3) is supported")
        bound = (torch.tensor(E4M3_MAX, device=inputs.device) if amax is None
                 else _amax_tensor(amax, inputs))
        ctx.save_for_backward(inputs, bound)
        tiny = inputs.abs() < _ZERO_AMAX
        if amax is None:
            out = e4m3(inputs)
        else:  # per tensor or any amax that broadcasts (per channel)
            scale = E4M3_MAX / torch.where(bound > 0, bound, 1.0)
            out = (e4m3(inputs.float() * scale) / scale).to(inputs.dtype)
        return out.masked_fill(tiny, 0.0)

    @staticmethod
    def backward(ctx, grad_outputs):  # type: ignore[override]
        inputs, bound = ctx.saved_tensors
        return _ste(grad_outputs, inputs, bound), None, None, None


def tensor_quant(inputs: torch.Tensor, amax: torch.Tensor | float, num_bits: int = 8,
                 unsigned: bool = False, narrow_range: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scale)`` with ``codes / scale ~= inputs``; straight-through gradient."""
    return TensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range)


def legacy_fake_tensor_quant(inputs: torch.Tensor, amax: torch.Tensor | float, num_bits: int = 8,
                             unsigned: bool = False, narrow_range: bool = True) -> torch.Tensor:
    """Quantize-dequantize in plain PyTorch (any amax that broadcasts to ``inputs``)."""
    return LegacyFakeTensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range)


def fake_tensor_quant(inputs: torch.Tensor, amax: torch.Tensor | float, num_bits: int = 8,
                      unsigned: bool = False, narrow_range: bool = True) -> torch.Tensor:
    """Quantize-dequantize with the fused kernel; gradient passes where ``|x| <= amax``.

    An amax that requires grad gets none, but (as there) the output is part of the graph.
    """
    if isinstance(amax, torch.Tensor) and amax.requires_grad and torch.is_grad_enabled():
        return FakeTensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range)
    amax_t = _amax_tensor(amax, inputs)
    _check(inputs, amax_t, unsigned)
    return functional.fake_tensor_quant(inputs, amax_t, num_bits, unsigned, narrow_range)


def fake_affine_tensor_quant(inputs: torch.Tensor, min_range: torch.Tensor | float,
                             max_range: torch.Tensor | float, num_bits: int = 8) -> torch.Tensor:
    """Asymmetric fake quantization of ``[min_range, max_range]`` (experimental there too)."""
    return FakeAffineTensorQuantFunction.apply(inputs, min_range, max_range, num_bits)


def scaled_e4m3(inputs: torch.Tensor, amax: torch.Tensor | float | None = None,
                E: int = 4, M: int = 3) -> torch.Tensor:
    """FP8 E4M3 fake quantization scaled so that ``amax`` maps to 448 (unscaled if None)."""
    return ScaledE4M3Function.apply(inputs, amax, E, M)

"""Functional fake quantization with straight-through gradients.

``fake_tensor_quant`` is the hot path of QAT: one fused pass forward, and a backward that
costs nothing when no element was clipped. ``fake_tensor_quant_learnable`` also returns the
gradient of ``amax`` (LSQ-style straight-through estimate).
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad as _forward_ad

from trtqat.quant import _kernels, fake_quant_op


def quant_bounds(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[int, int]:
    """Integer range ``(qmin, qmax)`` for the given format."""
    qmax = 2 ** (num_bits - 1 + int(unsigned)) - 1
    if unsigned:
        return 0, qmax
    return (-qmax if narrow_range else -qmax - 1), qmax


_is_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state
_onnx_flags: list = []  # [(GLOBALS, _flags)] once looked up, [None] where torch has neither


def onnx_exporting() -> bool:
    """``torch.onnx.is_in_onnx_export()`` without its two imports per call (it costs more
    than a small fake-quant kernel, and every quantizer call asks)."""
    if _is_compiling():  # dynamo traces the public function, not torch's internal flags
        return torch.onnx.is_in_onnx_export()
    if not _onnx_flags:
        try:
            from torch.onnx._internal.exporter import _flags
            from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
            ok = hasattr(GLOBALS, "in_onnx_export") and hasattr(_flags, "_is_onnx_exporting")
        except ImportError:
            ok = False
        _onnx_flags.append((GLOBALS, _flags) if ok else None)
    flags = _onnx_flags[0]
    if flags is None:
        return torch.onnx.is_in_onnx_export()
    return bool(flags[0].in_onnx_export or flags[1]._is_onnx_exporting)


class _FakeQuantFn(torch.autograd.Function):
    """Eager fake quantization: fused kernels forward, the smallest possible saved state.

    CUDA (Triton): saves a bit-packed clip mask instead of the input. CPU: saves nothing when
    nothing was clipped (identity backward), else the input and amax.
    """

    @staticmethod
    def forward(ctx, x, amax, qmin, qmax):  # type: ignore[override]
        ctx.qbounds = (qmin, qmax)
        masked = _kernels.fake_quant_forward_masked(x, amax, qmin, qmax)
        if masked is not None:
            y, mask = masked
            ctx.layout = (x.shape, x.stride())
            ctx.passthrough = False
            ctx.save_for_backward(mask)
            return y
        y, clipped = _kernels.fake_quant_forward(x, amax, qmin, qmax)
        ctx.layout = None
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
        if ctx.layout is not None:
            (mask,) = ctx.saved_tensors
            return _kernels.fake_quant_grad_masked(grad, mask, *ctx.layout), None, None, None
        x, amax = ctx.saved_tensors
        qmin, qmax = ctx.qbounds
        return _kernels.fake_quant_grad_input(grad, x, amax, qmin, qmax), None, None, None


class _FakeQuantLearnableFn(torch.autograd.Function):
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
        grad_x, grad_amax = _kernels.fake_quant_learnable_grad(grad, x, amax.detach(), qmin, qmax)
        return grad_x, grad_amax, None, None


class _Entry:
    """What quantizers call: eager autograd with the fused kernels, the custom op under
    torch.compile (:func:`.fake_quant_op.traced`: recomputed in backward). Inputs that are
    not floating point are refused."""

    def __init__(self, function: type[torch.autograd.Function]) -> None:
        self.function = function

    def apply(self, x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
        _kernels.check_input(x)
        if _is_compiling():
            return fake_quant_op.traced(x, amax, qmin, qmax)
        if ((not torch.is_grad_enabled() or not (x.requires_grad or amax.requires_grad))
                and not _tracing() and _forward_ad._current_level < 0):
            # nothing to differentiate (evaluation, calibration): the forward kernel alone,
            # without an autograd.Function's cost or the mask a backward would need
            # (torch.jit.trace records the Function, not the kernels inside it; forward-mode
            # AD must meet the Function, which says it has no formula)
            return _kernels.fake_quant_forward(x, amax, qmin, qmax)[0]
        return self.function.apply(x, amax, qmin, qmax)


_FakeQuant = _Entry(_FakeQuantFn)
_FakeQuantLearnable = _Entry(_FakeQuantLearnableFn)  # amax also receives its gradient


def _as_amax(amax: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(amax, torch.Tensor):
        amax = torch.tensor(float(amax), device=like.device)
    return amax


def fake_tensor_quant(inputs: torch.Tensor, amax: torch.Tensor | float, num_bits: int = 8,
                      unsigned: bool = False, narrow_range: bool = True) -> torch.Tensor:
    """Quantize then dequantize ``inputs`` with range ``amax`` (straight-through gradient).

    ``amax`` is a scalar or a tensor broadcastable to ``inputs`` (per-channel ranges keep
    their dimensions, e.g. shape ``(C, 1, 1, 1)`` for conv weights). No gradient flows to
    ``amax``; use :func:`fake_tensor_quant_learnable` for that.
    """
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    return _FakeQuant.apply(inputs, _as_amax(amax, inputs).detach(), qmin, qmax)


def fake_tensor_quant_learnable(inputs: torch.Tensor, amax: torch.Tensor, num_bits: int = 8,
                                unsigned: bool = False, narrow_range: bool = True) -> torch.Tensor:
    """Like :func:`fake_tensor_quant`, and ``amax`` receives its straight-through gradient."""
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    return _FakeQuantLearnable.apply(inputs, amax, qmin, qmax)


def tensor_quant(inputs: torch.Tensor, amax: torch.Tensor | float, num_bits: int = 8,
                 unsigned: bool = False, narrow_range: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``inputs``: returns ``(integers as float tensor, scale)``.

    As in pytorch-quantization, ``scale = qmax / amax`` and ``inputs ~= outputs / scale``.
    """
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    amax = _as_amax(amax, inputs).detach()
    step = _kernels.scale_of(amax, qmax)
    outputs = torch.round(inputs.float() / step).clamp_(qmin, qmax).to(inputs.dtype)
    return outputs, (1.0 / step)

"""Quantized convolution and linear layers that keep less for backward.

The plain path, ``conv(input_quantizer(x), weight_quantizer(w))``, leaves the
fake-quantized input (and, under autocast, its low-precision copy) and the fake-quantized
weight copy alive until backward, because the convolution saves what it was given. Here one
autograd function does both quantizations and the layer, and keeps instead:

* ``x`` itself when the op that produced it keeps it anyway (an in-place ReLU saves its
  result): no extra bytes; backward quantizes ``x`` again;
* else the integer codes of ``x`` (int8 for 8-bit ranges: 1 byte an element instead of 2
  or 4), plus a bool mask of the elements inside the range only when some element was
  clipped and ``x`` needs its gradient (a code at the bound cannot tell clipped from not);
* nothing for the weight: backward quantizes the parameter again (weights are small).

Backward rebuilds the quantized operands in the dtype autocast gave the layer and calls the
same backward kernels autograd would (``aten.convolution_backward``; the matrix products of
``addmm``'s backward for linear), then the same straight-through kernels as the quantizers,
so gradients are bit-identical to the plain path.

Where: on GPU tensors by default, where step memory binds (the codes cost a pass over each
input, about 7-10% of a small CPU step, so CPU tensors take the plain path unless asked:
``TRTQAT_LEAN_BACKWARD=1``, or ``set_enabled(True)``). It is used only where the numerics
are the plain path's: both quantizers in their common
QAT state (a stored int amax, fake quantization, no calibration, clip, learned amax,
pre-quant scale, hooks or export), a gradient wanted, not under ``torch.compile`` (inductor's
partitioner decides what compiled graphs keep). Everything else takes the plain path.
:func:`set_enabled` turns it off (e.g. to compare), as does the environment variable
``TRTQAT_LEAN_BACKWARD=0`` read at import (``1``: on every device; unset: GPUs only).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch
from torch.autograd.function import once_differentiable
from torch.nn.modules import module as nn_module

from trtqat.quant import _kernels, fast_path
from trtqat.quant.amax import fits
from trtqat.quant.tensor_quantizer import TensorQuantizer, _exporting, _int_bounds

__all__ = ["GPU", "disabled", "enabled", "quant_conv", "quant_linear", "set_enabled", "using"]

GPU = "gpu"  # set_enabled(GPU): tensors on a GPU only (the default)

_ENV = os.environ.get("TRTQAT_LEAN_BACKWARD", "").strip()
_state: dict[str, bool | str] = {"enabled": {"0": False, "1": True}.get(_ENV, GPU)}
_is_compiling = torch.compiler.is_compiling
_CODE_DTYPES = ((-128, 127, torch.int8), (0, 255, torch.uint8), (-32768, 32767, torch.int16))


def enabled() -> bool | str:
    """Where quantized conv/linear layers use the lean-backward path: True (every device),
    ``"gpu"`` (the default: tensors not on the CPU) or False (nowhere)."""
    return _state["enabled"]


def set_enabled(on: bool | str) -> bool | str:
    """Use the lean-backward path everywhere (True), on GPU tensors only (``"gpu"``, the
    default) or nowhere (False); returns the previous setting."""
    if on != GPU:
        on = bool(on)
    previous, _state["enabled"] = _state["enabled"], on
    return previous


@contextlib.contextmanager
def using(on: bool | str) -> Iterator[None]:
    """``set_enabled(on)`` inside the ``with`` block, the previous setting after it."""
    previous = set_enabled(on)
    try:
        yield
    finally:
        set_enabled(previous)


def disabled() -> contextlib.AbstractContextManager[None]:
    """The plain path inside the ``with`` block."""
    return using(False)


def _plain_range(q, x: torch.Tensor) -> tuple[torch.Tensor, int, int] | None:
    """``(amax, qmin, qmax)`` when quantizer ``q`` would take its plain fake-quant branch on
    ``x`` (see ``TensorQuantizer.forward``), else None."""
    if type(q) is not TensorQuantizer or q._disabled or q._forward_hooks or q._forward_pre_hooks:
        return None
    amax = q._buffers.get("_amax")
    if not fast_path.is_plain(q, amax) or q._unsigned:
        return None
    qmin, qmax = _int_bounds(q._num_bits, False, q._narrow_range)
    if qmax < 1 or not (amax.numel() == 1 or fits(amax.shape, x.shape)):
        return None
    return amax.detach(), qmin, qmax


def _ranges(layer, x: torch.Tensor, weight: torch.Tensor):
    """Both quantizers' plain ranges, or None where the plain path must run (the callers
    have checked first that the path is on for ``x``'s device)."""
    if (_is_compiling() or not torch.is_grad_enabled()
            or not (x.requires_grad or weight.requires_grad) or not x.is_floating_point()
            or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
            or _exporting()):
        return None
    xr = _plain_range(layer._input_quantizer, x)
    wr = xr and _plain_range(layer._weight_quantizer, weight)
    return (xr, wr) if wr else None


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """``t`` as autocast hands it to a lower-precision op (``dtype`` None: autocast off)."""
    if t is None or dtype is None or not t.is_floating_point() or t.dtype in (dtype, torch.float64):
        return t
    return t.to(dtype)


_NO_CONTEXT = contextlib.nullcontext()


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """A block where autocast is off: ``torch.autocast(enabled=False)`` only where it is on
    (building that context costs more host time than a small layer's kernels)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return _NO_CONTEXT


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


# backward nodes whose formula saves the op's result (its output), not its input
_RESULT_SAVERS = frozenset({"ReluBackward0", "SigmoidBackward0", "TanhBackward0"})


def _kept_by_producer(x: torch.Tensor) -> bool:
    """Whether the op that produced ``x`` saved ``x`` itself for its own backward.

    Told from the node's name: reading its saved result would unpack it, which saved-tensor
    hooks (activation checkpointing) must not see during the forward."""
    fn = x.grad_fn
    return fn is not None and fn.name() in _RESULT_SAVERS


def _quantized(t: torch.Tensor, amax: torch.Tensor, bounds: tuple[int, int],
               cast: torch.dtype | None) -> torch.Tensor:
    """Fake-quantized ``t``, in the layer's dtype where the GPU kernels make it in the same
    pass (:func:`_cast` finishes the others)."""
    encoded = _kernels.fake_quant_encode(t, amax, *bounds, False, None,
                                         _layer_dtype(t.dtype, cast))
    return encoded[0] if encoded is not None else _kernels.fake_quant_forward(t, amax, *bounds)[0]


def _requant(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int,
             cast: torch.dtype | None = None,
             ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """Fake-quantized ``x`` and its straight-through gradient, as ``_FakeQuantFn`` computes
    them (the bit-packed mask on CUDA, with ``x`` made in the layer's dtype in the same pass;
    the compiled CPU kernels; else pure PyTorch)."""
    encoded = _kernels.fake_quant_encode(x, amax, qmin, qmax, True, None,
                                         _layer_dtype(x.dtype, cast))
    if encoded is not None:
        y, mask, _ = encoded
        return y, lambda g: _kernels.fake_quant_grad_masked(g, mask, x.shape, x.stride())
    if x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu":
        # no compiled kernel for these: the pure-PyTorch formulas of ``_fused``, with the
        # rounding shared by the value and the mask (one pass less than calling both)
        scale = _kernels.scale_of(amax, qmax)
        q = (x.float() / scale).round_()
        mask = (q >= qmin) & (q <= qmax)
        return (q.clamp_(qmin, qmax).mul_(scale).to(x.dtype),
                lambda g: g * mask.to(g.dtype))
    y, clipped = _kernels.fake_quant_forward(x, amax, qmin, qmax)
    if clipped is False:
        return y, lambda g: g
    return y, lambda g: _kernels.fake_quant_grad_input(g, x, amax, qmin, qmax)


def _code_dtype(qmin: int, qmax: int) -> torch.dtype | None:
    return next((dt for lo, hi, dt in _CODE_DTYPES if lo <= qmin and qmax <= hi), None)


def _encode(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int, dtype: torch.dtype,
            want_mask: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """``(fake-quantized x, integer codes, inside-range mask or None)``; the values are the
    quantizers' (``_fused`` formulas); the mask is None when nothing was clipped. None when
    ``x`` holds a NaN, which no code can carry to backward."""
    scale = _kernels.scale_of(amax, qmax)
    r = (x.float() / scale).round_()
    lo, hi = torch.aminmax(r) if r.numel() else (r.new_zeros(()), r.new_zeros(()))
    if bool(torch.isnan(lo) | torch.isnan(hi)):
        return None
    mask = None
    if want_mask and (bool(lo < qmin) or bool(hi > qmax)):
        mask = (r >= qmin) & (r <= qmax)
    r.clamp_(qmin, qmax)
    codes = r.to(dtype)
    return r.mul_(scale).to(x.dtype), codes, mask


def _layer_dtype(x_dtype: torch.dtype, cast: torch.dtype | None) -> torch.dtype:
    """The dtype the quantized ``x`` reaches the layer in: autocast's for a float32 ``x``
    (made straight from float32, as ``y.to(cast)`` would), else ``x``'s own (cast after, as
    the plain path rounds twice)."""
    return cast if cast is not None and x_dtype == torch.float32 else x_dtype


def _encode_masked(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int,
                   dtype: torch.dtype, cast: torch.dtype | None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(fake-quantized x, integer codes, bit-packed straight-through mask)`` from the GPU
    kernels in one pass, the first in the layer's dtype where it can be, with no host read
    (nothing stalls the stream or breaks a CUDA-graph capture); None where they do not apply
    (the CPU: :func:`_encode`). A NaN input is not looked for here: its loss is NaN, which
    the training loop refuses."""
    encoded = _kernels.fake_quant_encode(x, amax, qmin, qmax, True, dtype,
                                         _layer_dtype(x.dtype, cast))
    if encoded is None:
        return None
    y, mask, codes = encoded
    return y, codes, mask


def _decode(codes: torch.Tensor, amax: torch.Tensor, qmax: int, x_dtype: torch.dtype,
            cast: torch.dtype | None) -> torch.Tensor:
    """The quantized ``x`` rebuilt from its codes, in the layer's dtype where it can be (one
    pass on a GPU; else torch ops, which :func:`_cast` finishes)."""
    out = _kernels.fake_quant_decode(codes, amax, qmax, _layer_dtype(x_dtype, cast))
    if out is not None:
        return out
    return codes.float().mul_(_kernels.scale_of(amax, qmax)).to(x_dtype)


class _LeanQuantFn(torch.autograd.Function):
    """``op(fq(x), fq(w), bias)`` keeping ``x`` (when kept anyway) or its codes, not the
    quantized copies. ``op`` is a :class:`_Op` (convolution or linear)."""

    @staticmethod
    def forward(ctx, x, weight, bias, x_amax, w_amax, xb, wb, op, cast):  # type: ignore[override]
        ctx.op, ctx.cast, ctx.xb, ctx.wb = op, cast, xb, wb
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.x_dtype = x.dtype
        wq = _quantized(weight, w_amax, wb, cast)
        code_dtype = _code_dtype(*xb)
        encoded = None
        ctx.packed = False  # the mask: bit-packed by the GPU kernels, else a bool tensor
        if code_dtype is not None and not _kept_by_producer(x):
            encoded = _encode_masked(x, x_amax, *xb, code_dtype, cast)
            ctx.packed = encoded is not None
            ctx.x_shape, ctx.x_stride = x.shape, x.stride()
            if encoded is None:
                encoded = _encode(x, x_amax, *xb, code_dtype, ctx.needs_input_grad[0])
        ctx.kept = encoded is None
        if ctx.kept:
            xq = _quantized(x, x_amax, xb, cast)
            ctx.save_for_backward(x, weight, x_amax, w_amax, None)
        else:
            xq, codes, mask = encoded
            ctx.save_for_backward(codes, weight, x_amax, w_amax, mask)
        with _autocast_off(x.device.type):
            return op.forward(_cast(xq, cast), _cast(wq, cast), _cast(bias, cast))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        saved, weight, x_amax, w_amax, mask = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if ctx.kept:
            xq, x_ste = _requant(saved, x_amax, *ctx.xb, ctx.cast)
        else:
            xq = _decode(saved, x_amax, ctx.xb[1], ctx.x_dtype, ctx.cast)
            if ctx.packed:
                def x_ste(g: torch.Tensor) -> torch.Tensor:
                    return _kernels.fake_quant_grad_masked(g, mask, ctx.x_shape, ctx.x_stride)
            else:
                x_ste = (lambda g: g) if mask is None else (lambda g: g.masked_fill(~mask, 0))
        wq, w_ste = _requant(weight, w_amax, *ctx.wb, ctx.cast)
        with _autocast_off(grad.device.type):
            gx, gw, gb = ctx.op.backward(grad, _cast(xq, ctx.cast), _cast(wq, ctx.cast),
                                         ctx.bias_shape, (need_x, need_w, need_b))
        gx = x_ste(gx.to(ctx.x_dtype)) if need_x else None
        gw = w_ste(gw.to(weight.dtype)) if need_w else None
        gb = gb.to(ctx.bias_dtype) if need_b else None
        return gx, gw, gb, None, None, None, None, None, None


class _ConvOp:
    """``aten.convolution`` (not transposed) and its backward."""

    def __init__(self, stride, padding, dilation, groups) -> None:
        self.args = (list(stride), list(padding), list(dilation))
        self.groups = groups

    def forward(self, x, w, b):
        stride, padding, dilation = self.args
        return torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False,
                                          [0] * len(stride), self.groups)

    def backward(self, grad, x, w, bias_shape, mask):
        stride, padding, dilation = self.args
        return torch.ops.aten.convolution_backward(
            grad, x, w, None if bias_shape is None else list(bias_shape), stride, padding,
            dilation, False, [0] * len(stride), self.groups, list(mask))


class _LinearOp:
    """``F.linear`` and the products of its backward (as ``addmm``'s for 2-D input)."""

    @staticmethod
    def forward(x, w, b):
        return torch.nn.functional.linear(x, w, b)

    @staticmethod
    def backward(grad, x, w, bias_shape, mask):
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = g2.mm(w).reshape(x.shape) if mask[0] else None
        gw = g2.t().mm(x.reshape(-1, x.shape[-1])) if mask[1] else None
        gb = g2.sum(0) if mask[2] else None
        return gx, gw, gb


_LINEAR = _LinearOp()


def quant_conv(layer, x: torch.Tensor) -> torch.Tensor | None:
    """``layer``'s quantized convolution of ``x`` on the lean path; None where the plain
    path must run (see the module docstring)."""
    on = _state["enabled"]  # first: on the CPU the path is off by default (a cheap no)
    if (not on or (on == GPU and x.device.type == "cpu") or layer.padding_mode != "zeros"
            or isinstance(layer.padding, str) or x.dim() != layer.weight.dim()):
        return None
    ranges = _ranges(layer, x, layer.weight)
    if ranges is None:
        return None
    (xa, *xb), (wa, *wb) = ranges
    op = _ConvOp(layer.stride, layer.padding, layer.dilation, layer.groups)
    return _LeanQuantFn.apply(x, layer.weight, layer.bias, xa, wa, tuple(xb), tuple(wb), op,
                              _autocast_dtype(x.device.type))


def quant_linear(layer, x: torch.Tensor) -> torch.Tensor | None:
    """``layer``'s quantized linear map of ``x`` on the lean path; None where the plain path
    must run."""
    on = _state["enabled"]
    if not on or (on == GPU and x.device.type == "cpu") or x.dim() < 2:
        return None
    ranges = _ranges(layer, x, layer.weight)
    if ranges is None:
        return None
    (xa, *xb), (wa, *wb) = ranges
    return _LeanQuantFn.apply(x, layer.weight, layer.bias, xa, wa, tuple(xb), tuple(wb),
                              _LINEAR, _autocast_dtype(x.device.type))

"""Fused fake-quant kernels for CUDA tensors, written in Triton (imported lazily).

Each kernel walks the tensor in *memory order* (any non-overlapping-and-dense layout:
contiguous, channels_last, a permuted weight...), so no input is copied and outputs made
with ``empty_like`` keep the input's strides. For a per-channel range along ``axis`` the
channel of the element at storage offset ``o`` is ``(o // stride[axis]) % size[axis]``.

* forward: ``y = clamp(round(x / s), qmin, qmax) * s`` in float32 (``s = amax / qmax``), stored
  in the input's dtype (float32, float16, bfloat16), plus, when asked, the straight-through
  mask bit-packed (1 bit per element, 1/32 of a float32 input) for the backward pass;
* encode: the forward that also writes the integer codes, and ``y`` in another float dtype
  (what the lean conv/linear path keeps and feeds its layer); decode: ``codes * s`` back;
* backward: ``grad * mask`` from that bit-packed mask (the input itself is not kept);
* learnable backward: the input gradient and the amax gradient of
  :class:`trtqat.quant.functional._FakeQuantLearnable` in one pass (float32 atomics).

Rounding is half-to-even like ``torch.round``: after clamping to ``[qmin - 1, qmax + 1]`` the
magic-number addition ``(v + 1.5 * 2**23) - 1.5 * 2**23`` rounds exactly (|v| <= 2**22); a
value rounded outside ``[qmin, qmax]`` is clipped, exactly as when rounding the unclamped
value. Division is IEEE (``div_rn``), so results equal the pure-PyTorch kernels bit for bit.
The scale is computed in the kernels too, from ``amax`` as given (no extra launch per call):
``max(amax / qmax, FLT_MIN)`` by IEEE division, as torch computes it on the CPU and ONNX
Runtime does, not as torch's CUDA division by a Python number (a product with its rounded
reciprocal, which can differ in the last bit).

CPU tensors are accepted only under Triton's interpreter (``TRITON_INTERPRET=1`` set before
triton is imported), which is how the tests check these kernels without a GPU.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK", "decode", "encode", "forward", "grad_from_mask", "learnable_grad",
           "unpack_mask", "usable"]

BLOCK = 1024  # elements per program; a multiple of 8 (one mask byte holds 8 elements)
_ROUND = 12582912.0  # 1.5 * 2**23
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _block(n, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """This program's id, the offsets of its elements and which of them exist."""
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    return pid, offs, offs < n


@triton.jit
def _scale(amax_ptr, offs, valid, cstride, nch, qmax, PER_CHANNEL: tl.constexpr):
    """``(s, channel)``: the step ``max(amax / qmax, FLT_MIN)`` in float32 (IEEE division; a
    NaN amax stays NaN, as torch's ``clamp_min``) of each element, and its channel."""
    ch = (offs // cstride) % nch
    if PER_CHANNEL:
        a = tl.load(amax_ptr + ch, mask=valid, other=1.0).to(tl.float32)
    else:
        a = tl.load(amax_ptr).to(tl.float32)
    s = tl.math.div_rn(a, qmax)
    return tl.where(s < 1.1754943508222875e-38, 1.1754943508222875e-38, s), ch


@triton.jit
def _quantize(x_ptr, amax_ptr, offs, valid, cstride, nch, qmin, qmax, PER_CHANNEL: tl.constexpr):
    """``(x / s, round(clamp(x / s, qmin - 1, qmax + 1)), s, channel)`` in float32."""
    x = tl.load(x_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    s, ch = _scale(amax_ptr, offs, valid, cstride, nch, qmax, PER_CHANNEL)
    q = tl.math.div_rn(x, s)
    qc = tl.clamp(q, qmin - 1.0, qmax + 1.0, propagate_nan=tl.PropagateNan.ALL)
    return q, (qc + 12582912.0) - 12582912.0, s, ch


@triton.jit
def _store(y_ptr, offs, y, valid):
    """Store float32 ``y`` in ``y_ptr``'s dtype, rounding to nearest even as torch's casts do."""
    if y_ptr.dtype.element_ty == tl.bfloat16:
        # round to nearest even by hand, as torch does (the interpreter's cast truncates)
        b = y.to(tl.uint32, bitcast=True)
        b = tl.where(y != y, 0x7FC0, (b + 0x7FFF + ((b >> 16) & 1)) >> 16)
        tl.store(y_ptr + offs, b.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=valid)
    else:
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _fq_forward(x_ptr, y_ptr, amax_ptr, mask_ptr, codes_ptr, n, nbytes, cstride, nch, qmin,
                qmax, PER_CHANNEL: tl.constexpr, SAVE_MASK: tl.constexpr,
                SAVE_CODES: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    pid, offs, valid = _block(n, WIDE, BLOCK)
    q, r, s, _ = _quantize(x_ptr, amax_ptr, offs, valid, cstride, nch, qmin, qmax, PER_CHANNEL)
    code = tl.clamp(r, qmin, qmax, propagate_nan=tl.PropagateNan.ALL)
    _store(y_ptr, offs, code * s, valid)
    if SAVE_CODES:
        tl.store(codes_ptr + offs, code.to(codes_ptr.dtype.element_ty), mask=valid)
    if SAVE_MASK:
        inside = ((r >= qmin) & (r <= qmax) & valid).to(tl.int32)
        bits = tl.reshape(inside, (BLOCK // 8, 8)) << tl.arange(0, 8)[None, :]
        packed = tl.sum(bits, axis=1).to(tl.uint8)
        boffs = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
        tl.store(mask_ptr + boffs, packed, mask=boffs < nbytes)


@triton.jit
def _fq_decode(codes_ptr, amax_ptr, out_ptr, n, cstride, nch, qmax, PER_CHANNEL: tl.constexpr,
               WIDE: tl.constexpr, BLOCK: tl.constexpr):
    _, offs, valid = _block(n, WIDE, BLOCK)
    code = tl.load(codes_ptr + offs, mask=valid, other=0).to(tl.float32)
    s, _ = _scale(amax_ptr, offs, valid, cstride, nch, qmax, PER_CHANNEL)
    _store(out_ptr, offs, code * s, valid)


@triton.jit
def _fq_grad_from_mask(g_ptr, mask_ptr, out_ptr, n, nbytes, WIDE: tl.constexpr,
                       BLOCK: tl.constexpr):
    pid, offs, valid = _block(n, WIDE, BLOCK)
    graw = tl.load(g_ptr + offs, mask=valid, other=0.0)
    boffs = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    packed = tl.load(mask_ptr + boffs, mask=boffs < nbytes, other=0).to(tl.int32)
    bits = tl.reshape((packed[:, None] >> tl.arange(0, 8)[None, :]) & 1, (BLOCK,))
    # the product is exactly representable in the gradient's dtype: the cast back is exact
    g = graw.to(tl.float32) * bits.to(tl.float32)
    tl.store(out_ptr + offs, g.to(graw.dtype), mask=valid)


@triton.jit
def _fq_learnable_grad(g_ptr, x_ptr, amax_ptr, gx_ptr, gamax_ptr, n, cstride, nch, qmin, qmax,
                       PER_CHANNEL: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    pid, offs, valid = _block(n, WIDE, BLOCK)
    q, r, s, ch = _quantize(x_ptr, amax_ptr, offs, valid, cstride, nch, qmin, qmax,
                            PER_CHANNEL)
    graw = tl.load(g_ptr + offs, mask=valid, other=0.0)
    g = graw.to(tl.float32)
    inside = (r >= qmin) & (r <= qmax)
    tl.store(gx_ptr + offs, (g * inside.to(tl.float32)).to(graw.dtype), mask=valid)
    # d y / d amax: (round(q) - q) / qmax inside the range, qmin/qmax or qmax/qmax outside
    outside = tl.clamp(r, qmin, qmax, propagate_nan=tl.PropagateNan.ALL)
    local = tl.where(inside, tl.math.div_rn(r - q, qmax), tl.math.div_rn(outside, qmax))
    contrib = tl.where(valid, g * local, 0.0)
    if PER_CHANNEL:
        tl.atomic_add(gamax_ptr + ch, contrib, mask=valid)
    else:
        tl.atomic_add(gamax_ptr, tl.sum(contrib, axis=0))


# ----------------------------------------------------------------------------- host side
def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs") else False


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill ``numel`` consecutive storage slots
    (trivially so without elements, whatever the strides of the other dimensions)."""
    if t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)):
        return True  # the common layouts, told by torch (host time: this runs every call)
    if t.numel() == 0:
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.stride() == b.stride():
        return a.shape == b.shape
    return a.shape == b.shape and all(
        sa == sb for sa, sb, sz in zip(a.stride(), b.stride(), a.shape) if sz != 1)


def usable(x: torch.Tensor) -> bool:
    """Whether these kernels can take ``x`` (a dense float tensor on CUDA, or CPU when interpreting)."""
    on_device = x.is_cuda or (x.device.type == "cpu" and _interpreting())
    return on_device and x.dtype in _DTYPES and _dense(x)


def _channel(x: torch.Tensor, amax: torch.Tensor) -> tuple[int, int] | None:
    """``(stride, count)`` of the channel axis of ``amax``; (1, 1) per tensor; None: unsupported.

    An ``amax`` with more dimensions than ``x`` is refused even with one element: broadcasting
    grows the result (the reference returns ``amax.dim()`` dimensions), which these kernels,
    writing ``empty_like(x)``, cannot.
    """
    if amax.dim() > x.dim():
        return None
    if amax.numel() == 1:
        return 1, 1
    shape = (1,) * (x.dim() - amax.dim()) + tuple(amax.shape)
    axes = [d for d, size in enumerate(shape) if size != 1]
    if len(axes) != 1 or shape[axes[0]] != x.shape[axes[0]]:
        return None  # several axes, or a size that only broadcasts
    return x.stride(axes[0]), x.shape[axes[0]]


def _amax_arg(amax: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``amax`` as the kernels read it: its elements in order, on ``device`` (a view where it
    is already there; the kernels compute the scale from it)."""
    if amax.device == device and amax.is_contiguous():  # read in storage order: no view
        return amax.detach() if amax.requires_grad else amax
    flat = amax.detach().reshape(-1)
    if flat.device != device:
        flat = flat.to(device)
    return flat if flat.is_contiguous() else flat.contiguous()


def _programs(n: int) -> int:
    """``ceil(n / BLOCK)`` (plain arithmetic: ``triton.cdiv`` costs microseconds of host time
    a call)."""
    return -(-n // BLOCK)


def _grid(n: int) -> tuple[int]:
    return (_programs(n),)


def _mask_bytes(n: int) -> int:
    """Bytes of the bit-packed mask of ``n`` elements.

    Computed here and passed to the kernels: in the kernels ``(n + 7) // 8`` would be int32
    arithmetic for ``n < 2**31`` (Triton types such an argument i32) and wrap to a negative
    bound for ``n`` within 7 of ``2**31``, so no mask byte would be stored or loaded.
    """
    return (n + 7) // 8


def _wide(n: int) -> bool:
    """Whether offsets need int64: the last program's ``pid * BLOCK + BLOCK - 1`` must fit int32."""
    return _programs(n) * BLOCK > 2**31 - 1


_SAME_DEVICE = contextlib.nullcontext()


def _launch_context(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current for a launch: Triton launches on the *current* CUDA device and
    its current stream, not on the device of the tensors it is given."""
    if device.type == "cuda" and device.index is not None \
            and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _SAME_DEVICE  # already current: switching costs host time for nothing


def forward(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int,
            save_mask: bool = True) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(y, bit-packed mask or None)``, or None when ``x``/``amax`` is not a supported case."""
    out = encode(x, amax, qmin, qmax, save_mask=save_mask)
    return None if out is None else out[:2]


def encode(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int, save_mask: bool = True,
           codes_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
           ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """``(y, bit-packed mask or None, integer codes or None)`` in one pass, or None when
    ``x``/``amax`` is not a supported case. ``y`` is stored in ``out_dtype`` (default
    ``x.dtype``), rounded once from float32 as ``y.to(out_dtype)`` would; the codes
    (``codes_dtype``, e.g. int8) are ``clamp(round(x / s), qmin, qmax)``, in ``x``'s layout."""
    chan = _channel(x, amax) if usable(x) else None
    out_dtype = out_dtype or x.dtype
    if chan is None or out_dtype not in _DTYPES:
        return None
    y = torch.empty_like(x, dtype=out_dtype)
    codes = None if codes_dtype is None else torch.empty_like(x, dtype=codes_dtype)
    if not _same_layout(x, y) or (codes is not None and not _same_layout(x, codes)):
        return None
    n = x.numel()
    mask = torch.empty(_mask_bytes(n), dtype=torch.uint8, device=x.device) if save_mask else None
    if n:
        with _launch_context(x.device):
            _fq_forward[_grid(n)](
                x, y, _amax_arg(amax, x.device), mask if save_mask else y,
                y if codes is None else codes, n, _mask_bytes(n), chan[0], chan[1], float(qmin),
                float(qmax), PER_CHANNEL=chan[1] > 1, SAVE_MASK=save_mask,
                SAVE_CODES=codes is not None, WIDE=_wide(n), BLOCK=BLOCK)
    return y, mask, codes


def decode(codes: torch.Tensor, amax: torch.Tensor, qmax: int, dtype: torch.dtype,
           ) -> torch.Tensor | None:
    """``(codes * s).to(dtype)`` (``s = amax / qmax`` in float32) in one pass, in the codes'
    layout; None when not supported here."""
    on_device = codes.is_cuda or (codes.device.type == "cpu" and _interpreting())
    chan = _channel(codes, amax) if on_device and _dense(codes) else None
    if chan is None or dtype not in _DTYPES or codes.dtype.is_floating_point:
        return None
    out = torch.empty_like(codes, dtype=dtype)
    if not _same_layout(codes, out):
        return None
    n = codes.numel()
    if n:
        with _launch_context(codes.device):
            _fq_decode[_grid(n)](codes, _amax_arg(amax, codes.device), out, n, chan[0],
                                 chan[1], float(qmax), PER_CHANNEL=chan[1] > 1, WIDE=_wide(n),
                                 BLOCK=BLOCK)
    return out


def unpack_mask(mask: torch.Tensor, shape: torch.Size, stride: tuple[int, ...]) -> torch.Tensor:
    """The bool mask of a tensor with ``shape``/``stride`` from its bit-packed form."""
    n = 1
    for size in shape:
        n *= size
    bits = (mask[:, None] >> torch.arange(8, device=mask.device, dtype=torch.uint8)) & 1
    return bits.reshape(-1)[:n].bool().as_strided(shape, stride)


def grad_from_mask(grad: torch.Tensor, mask: torch.Tensor, shape: torch.Size,
                   stride: tuple[int, ...]) -> torch.Tensor:
    """``grad`` where the saved mask is set, 0 elsewhere (input of ``shape``/``stride``)."""
    like = torch.empty_strided(shape, stride, dtype=grad.dtype, device="meta")
    if not (usable(grad) and _same_layout(grad, like)):  # e.g. a contiguous grad of a
        return grad * unpack_mask(mask, shape, stride).to(grad.dtype)  # channels_last input
    out = torch.empty_like(grad)
    n = grad.numel()
    if n:
        with _launch_context(grad.device):
            _fq_grad_from_mask[_grid(n)](grad, mask, out, n, _mask_bytes(n), WIDE=_wide(n),
                                         BLOCK=BLOCK)
    return out


def learnable_grad(grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int,
                   qmax: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(grad_x, grad_amax)`` of the learnable fake-quant, or None when not supported here.

    The amax gradient is summed with float32 atomics, whose order (hence last bits) varies
    between runs; under ``torch.use_deterministic_algorithms(True)`` this returns None so the
    caller uses the deterministic PyTorch reduction.
    """
    if torch.are_deterministic_algorithms_enabled():
        return None
    chan = _channel(x, amax) if usable(x) else None
    if chan is None or not _same_layout(grad, x) or grad.dtype not in _DTYPES or \
            grad.device != x.device:
        return None
    gx = torch.empty_like(grad)
    gamax = torch.zeros(chan[1], dtype=torch.float32, device=x.device)
    n = x.numel()
    if n:
        with _launch_context(x.device):
            _fq_learnable_grad[_grid(n)](
                grad, x, _amax_arg(amax, x.device), gx, gamax, n, chan[0], chan[1],
                float(qmin), float(qmax), PER_CHANNEL=chan[1] > 1, WIDE=_wide(n),
                BLOCK=BLOCK)
    return gx, gamax.reshape(amax.shape).to(amax.dtype)

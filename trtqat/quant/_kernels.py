"""Picks the fastest available fake-quant kernels for each tensor.

* CUDA tensors (float32/float16/bfloat16, any dense layout): the Triton kernels of
  :mod:`.triton_kernels`, imported on the first CUDA tensor;
* float32 and bfloat16 CPU tensors (bfloat16: what CPU autocast hands the activation
  quantizers): the compiled C++ kernel (``trtqat._C`` built at install time, or the same
  source compiled once on first use into a per-user cache: :mod:`.kernel_loader`);
* everything else (other dtypes, non-dense layouts, multi-axis amax, tracing under
  ``torch.compile``): the pure-PyTorch kernels of :mod:`._fused`. All give bit-identical values.

When a fast kernel cannot be had, the first quantized forward on that device warns once,
with the fix; :func:`kernel_report` (shown by ``trtqat --version``) says the same.

``BACKEND`` names the CPU kernels in use (``"cpp"`` or ``"pytorch"``) and ``GPU_BACKEND`` the
CUDA ones (``"triton"``, ``"pytorch"``, or None before the first CUDA tensor). Set the
environment variable ``TRTQAT_KERNELS=pytorch`` before import, or call :func:`set_backend`,
to force the pure-PyTorch path everywhere (e.g. to compare).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

from trtqat.errors import QuantInputError
from trtqat.quant import _fused, kernel_loader
from trtqat.quant._fused import scale_of

__all__ = ["BACKEND", "EXTENSION_ERROR", "GPU_BACKEND", "available_backends", "check_input",
           "empty_cache", "fake_quant_decode", "fake_quant_encode",
           "fake_quant_forward", "fake_quant_forward_masked",
           "fake_quant_grad_input", "fake_quant_grad_masked", "fake_quant_learnable_grad",
           "hot_kernel", "kernel_report", "pool_stats", "scale_of", "set_backend"]

_C, EXTENSION_ERROR = kernel_loader.prebuilt_cpu()
_triton = None  # trtqat.quant.triton_kernels once a CUDA tensor was seen and Triton imports
_MISSING: dict[str, str] = {}  # device type -> why its fast kernels are missing, with the fix
_pending = {"cpu", "cuda"}  # device types whose fast kernels were not looked for yet
_forced = ""  # "pytorch": pure-PyTorch kernels everywhere; "cpp"/"triton": that one required

BACKEND = "pytorch"
GPU_BACKEND: str | None = None
EPOCH = 0  # bumped whenever the kernels in use may change (quantizers re-decide their path)
_named: tuple | None = None  # what _names() last saw: backends, forcing and kernels

_is_compiling = torch.compiler.is_compiling
_fused_forward = _fused.fake_quant_forward
_fused_grad_input = _fused.fake_quant_grad_input


def check_input(x: torch.Tensor) -> None:
    """Refuse inputs fake quantization cannot take, in one line that says what to do."""
    if not isinstance(x, torch.Tensor):
        raise QuantInputError(f"fake quantization takes a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise QuantInputError(
            f"fake quantization needs a floating-point tensor, got {x.dtype}; cast the input "
            "(e.g. x.float()) or disable this quantizer for integer tensors such as token ids")


def _names() -> None:
    global BACKEND, GPU_BACKEND, EPOCH, _named
    if _forced == "pytorch":
        BACKEND, GPU_BACKEND = "pytorch", "pytorch"
    else:
        BACKEND = "cpp" if _C is not None else "pytorch"
        GPU_BACKEND = (None if "cuda" in _pending
                       else ("triton" if _triton is not None else "pytorch"))
    now = (BACKEND, GPU_BACKEND, _forced, _C, _triton)
    if now != _named:  # only a real change makes the quantizers decide their path again
        _named, EPOCH = now, EPOCH + 1


def _resolve(device_type: str) -> None:
    """Look for the fast kernels of ``device_type`` once; warn once when they are missing."""
    global _C, EXTENSION_ERROR, _triton
    _pending.discard(device_type)
    if device_type == "cpu" and _C is None:
        _C, EXTENSION_ERROR = kernel_loader.cpu_kernels()
        reason = EXTENSION_ERROR
    elif device_type == "cuda" and _triton is None:
        _triton, reason = kernel_loader.gpu_kernels()
    else:
        reason = None
    _names()
    if reason is not None:
        _MISSING[device_type] = reason
        warnings.warn(f"trtqat: fake quantization on {device_type} uses the slower pure-PyTorch "
                      f"kernels: {reason}", RuntimeWarning, stacklevel=4)


def _ready(x: torch.Tensor) -> None:
    kind = x.device.type
    if kind in _pending and _forced != "pytorch":
        _resolve(kind)


def available_backends() -> tuple[str, ...]:
    """CPU backends that :func:`set_backend` accepts here (may build the CPU kernel once)."""
    if "cpu" in _pending and _forced != "pytorch":
        _resolve("cpu")
    return ("cpp", "pytorch") if _C is not None else ("pytorch",)


def set_backend(name: str | None = None) -> str:
    """Use ``"cpp"``, ``"triton"`` or ``"pytorch"`` kernels (None: the fastest); returns the CPU one.

    ``"pytorch"`` forces the pure-PyTorch kernels on every device; ``"cpp"`` and ``"triton"``
    require that kernel (CPU and CUDA respectively) and use the fastest on the other device.
    """
    global _forced
    if name not in (None, "cpp", "triton", "pytorch"):
        raise ValueError(f"unknown fake-quant backend {name!r}: use 'cpp', 'triton' or 'pytorch'")
    _forced = name or ""
    if name != "pytorch":
        for kind in ("cpu", "cuda") if name == "triton" else ("cpu",):
            if kind in _pending:
                _resolve(kind)
    _names()
    if name == "cpp" and _C is None:
        raise RuntimeError(f"the compiled fake-quant kernels are not available ({EXTENSION_ERROR})")
    if name == "triton" and _triton is None:
        raise RuntimeError(_MISSING.get("cuda", "the Triton kernels are not available"))
    return BACKEND


def hot_kernel() -> Callable | None:
    """The compiled CPU entry point ``fake_quant_apply(x, amax, qmin, qmax, check_negative)``
    (fake quantization with its autograd node in one call; None where it does not take the
    inputs), or None: the pure-PyTorch kernels are forced, or the extension is missing or
    was built from an older source (rebuild: ``pip install --no-build-isolation -e .``)."""
    if "cpu" in _pending and _forced != "pytorch":
        _resolve("cpu")
    if _forced == "pytorch" or _C is None:
        return None
    return getattr(_C, "fake_quant_apply", None)


def _fast(device_type: str) -> bool:
    if _forced == "pytorch" or _is_compiling():
        return False  # under torch.compile the traceable PyTorch kernels keep the graph whole
    if device_type == "cpu":
        return _C is not None
    return device_type == "cuda" and _triton is not None


def empty_cache() -> None:
    """Release the output buffers the compiled CPU kernels keep for reuse between steps.

    The kernels reuse the storage of an output once nothing references it any more (same
    size next step), which spares the page faults of fresh allocations. At most
    ``TRTQAT_POOL_MB`` MiB (default 2048; 0 disables the pool) are kept.
    """
    if _C is not None:
        _C.empty_cache()


def pool_stats() -> dict:
    """Bytes and buffers the compiled kernels keep for reuse (empty without the extension)."""
    return dict(_C.pool_stats()) if _C is not None else {}


def fake_quant_forward(
    x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> tuple[torch.Tensor, bool | None]:
    """Fake-quantize ``x``; also say whether any element was clipped (None: unknown)."""
    _ready(x)
    if _fast(x.device.type):
        if x.is_cuda:
            out = _triton.forward(x, amax, qmin, qmax, save_mask=False)
            if out is not None:
                return out[0], None
        else:
            out = _C.fake_quant_forward(x, amax, qmin, qmax)
            if out is not None:
                return out
    return _fused_forward(x, amax, qmin, qmax)


def fake_quant_grad_input(
    grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """``grad`` where ``x`` was not clipped, 0 elsewhere."""
    if not x.is_cuda and _fast(x.device.type):
        out = _C.fake_quant_grad_input(grad, x, amax, qmin, qmax)
        if out is not None:
            return out
    return _fused_grad_input(grad, x, amax, qmin, qmax)


def fake_quant_forward_masked(
    x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(y, bit-packed straight-through mask)`` from the GPU kernels; None where they do not apply."""
    _ready(x)
    if x.is_cuda and _fast("cuda"):
        return _triton.forward(x, amax, qmin, qmax, save_mask=True)
    return None


def fake_quant_encode(
    x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int, save_mask: bool,
    codes_dtype: torch.dtype | None, out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """``(y in out_dtype, bit-packed straight-through mask or None, integer codes or None)``
    from the GPU kernels in one pass; None where they do not apply."""
    _ready(x)
    if x.is_cuda and _fast("cuda"):
        return _triton.encode(x, amax, qmin, qmax, save_mask, codes_dtype, out_dtype)
    return None


def fake_quant_decode(codes: torch.Tensor, amax: torch.Tensor, qmax: int,
                      dtype: torch.dtype) -> torch.Tensor | None:
    """``(codes * scale).to(dtype)`` from the GPU kernels in one pass; None where they do not
    apply (the caller computes it with torch ops)."""
    if codes.is_cuda and _fast("cuda"):
        return _triton.decode(codes, amax, qmax, dtype)
    return None


def fake_quant_grad_masked(grad: torch.Tensor, mask: torch.Tensor, shape: torch.Size,
                           stride: tuple[int, ...]) -> torch.Tensor:
    """``grad`` where the mask saved by :func:`fake_quant_forward_masked` is set, 0 elsewhere."""
    from trtqat.quant import triton_kernels  # only reached after the forward imported it

    return triton_kernels.grad_from_mask(grad, mask, shape, stride)


def fake_quant_learnable_grad(
    grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_x, grad_amax)`` of fake quantization with a learned ``amax``."""
    if x.is_cuda and _fast("cuda"):
        out = _triton.learnable_grad(grad, x, amax, qmin, qmax)
        if out is not None:
            return out
    return _fused.learnable_grad(grad, x, amax, qmin, qmax)


def kernel_report() -> dict[str, str]:
    """Which fake-quant kernels each device uses, with the reason and fix for a missing one.

    Looks for the kernels first (may compile the CPU kernel once); never initialises CUDA.
    """
    if _forced == "pytorch":
        forced = "pytorch (forced: TRTQAT_KERNELS=pytorch or set_backend('pytorch'))"
        return {"cpu": forced, "cuda": forced}
    for kind in list(_pending):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _resolve(kind)
    cpu = (f"compiled C++ for float32/bfloat16, {getattr(_C, '__file__', '?')}" if _C is not None
           else f"pytorch - {_MISSING.get('cpu', 'not available')}")
    if _C is not None and not hasattr(_C, "fake_quant_apply"):
        cpu += ("; built from an older source, without the one-call quantizer path: rebuild "
                "with pip install --no-build-isolation -e .")
    cuda = "Triton for float32/float16/bfloat16" if _triton is not None else \
        f"pytorch - {_MISSING.get('cuda', 'not available')}"
    return {"cpu": cpu, "cuda": cuda}


if _C is not None:
    _pending.discard("cpu")
_requested = os.environ.get("TRTQAT_KERNELS", "").strip().lower()
_forced = "pytorch" if _requested in ("pytorch", "torch", "python", "fallback") else ""
_names()

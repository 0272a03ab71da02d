"""Picks the fastest available fake-quant kernels (compiled if built, else pure PyTorch).

The compiled CPU kernels (``trtqat._C``, built from ``quant/csrc/fake_quant.cpp`` at install
time) handle float32 CPU tensors quantized per tensor or per channel along one axis; they
return None for anything else (other dtypes, CUDA, non-contiguous per-channel inputs,
multi-axis amax), which then goes to the pure-PyTorch kernels of :mod:`._fused`. Both give
bit-identical results.

``BACKEND`` is ``"cpp"`` when the compiled kernels are in use, else ``"pytorch"``. Set the
environment variable ``TRTQAT_KERNELS=pytorch`` before import, or call
:func:`set_backend`, to force the pure-PyTorch path (e.g. to compare).
"""

from __future__ import annotations

import os

import torch

from trtqat.quant import _fused
from trtqat.quant._fused import scale_of

__all__ = ["BACKEND", "EXTENSION_ERROR", "available_backends", "empty_cache",
           "fake_quant_forward", "fake_quant_grad_input", "pool_stats", "scale_of", "set_backend"]

try:
    from trtqat import _C
except (ImportError, OSError) as exc:  # not built, or built against another torch
    _C = None
    EXTENSION_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    EXTENSION_ERROR = None

BACKEND = "pytorch"

_fused_forward = _fused.fake_quant_forward
_fused_grad_input = _fused.fake_quant_grad_input


def _pytorch_forward(x, amax, qmin, qmax):
    return _fused_forward(x, amax, qmin, qmax)


def _pytorch_grad_input(grad, x, amax, qmin, qmax):
    return _fused_grad_input(grad, x, amax, qmin, qmax)


if _C is not None:
    _c_forward = _C.fake_quant_forward
    _c_grad_input = _C.fake_quant_grad_input

    _is_compiling = torch.compiler.is_compiling

    # The compiled kernels return None for inputs they do not handle. Under torch.compile
    # the traceable PyTorch kernels are used so that the graph does not break.
    def _cpp_forward(x, amax, qmin, qmax):
        out = None if _is_compiling() else _c_forward(x, amax, qmin, qmax)
        return _fused_forward(x, amax, qmin, qmax) if out is None else out

    def _cpp_grad_input(grad, x, amax, qmin, qmax):
        out = None if _is_compiling() else _c_grad_input(grad, x, amax, qmin, qmax)
        return _fused_grad_input(grad, x, amax, qmin, qmax) if out is None else out


_forward_impl = _pytorch_forward
_grad_input_impl = _pytorch_grad_input


def available_backends() -> tuple[str, ...]:
    """Backends that :func:`set_backend` accepts here."""
    return ("cpp", "pytorch") if _C is not None else ("pytorch",)


def set_backend(name: str | None = None) -> str:
    """Use ``"cpp"`` or ``"pytorch"`` kernels (None: the fastest available); returns it."""
    global BACKEND, _forward_impl, _grad_input_impl
    if name is None:
        name = "cpp" if _C is not None else "pytorch"
    if name == "cpp":
        if _C is None:
            raise RuntimeError(f"the compiled fake-quant kernels are not available ({EXTENSION_ERROR}); "
                               "reinstall with `pip install --no-build-isolation -e .` and a C++ compiler")
        _forward_impl, _grad_input_impl = _cpp_forward, _cpp_grad_input
    elif name == "pytorch":
        _forward_impl, _grad_input_impl = _pytorch_forward, _pytorch_grad_input
    else:
        raise ValueError(f"unknown fake-quant backend {name!r}: use 'cpp' or 'pytorch'")
    BACKEND = name
    return name


def empty_cache() -> None:
    """Release the output buffers the compiled kernels keep for reuse between steps.

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
    return _forward_impl(x, amax, qmin, qmax)


def fake_quant_grad_input(
    grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """``grad`` where ``x`` was not clipped, 0 elsewhere."""
    return _grad_input_impl(grad, x, amax, qmin, qmax)


_requested = os.environ.get("TRTQAT_KERNELS", "").strip().lower()
set_backend("pytorch" if _requested in ("pytorch", "torch", "python", "fallback") else None)

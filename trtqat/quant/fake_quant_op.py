"""``torch.ops.trtqat.fake_quant``: fake quantization as a registered custom operator.

This is what a quantizer calls while ``torch.compile`` traces it (eager mode keeps the
autograd functions of :mod:`.functional`, whose backward state is smaller). The operator has

* a real implementation: the fastest kernels for the tensor (:mod:`._kernels`: Triton on
  CUDA, compiled C++ for float32 CPU, else pure PyTorch) - used when a compiled graph keeps
  the operator (``backend="eager"`` / ``"aot_eager"``);
* a fake (meta) implementation, so Dynamo traces it without running it: no graph break;
* registered autograd: the backward is a second custom operator, ``fake_quant_grad`` (input
  gradient, straight-through with clipping), or ``fake_quant_learnable_grad`` when ``amax``
  requires a gradient (the input and the amax gradient, as ``_FakeQuantLearnable``);
* decompositions into plain aten ops (:mod:`._fused`, the reference formulas), registered in
  inductor's decomposition table when Dynamo first traces the operator. Inductor therefore
  never sees an opaque call: after AOT autograd the quantizer is ``div / round / clamp / mul``
  (and ``ge / le / mul`` backward), which it fuses with the neighbouring elementwise work
  (batch-norm, ReLU, residual adds) into one generated kernel, and its partitioner decides
  what backward keeps.

Calibration is not traced: it stays eager.
"""

from __future__ import annotations

import torch

from trtqat.quant import _fused, _kernels

__all__ = ["fake_quant", "fake_quant_grad", "fake_quant_learnable_grad",
           "register_inductor_decompositions"]

_DECOMPOSED = False


@torch.library.custom_op("trtqat::fake_quant", mutates_args=())
def fake_quant(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(x / s), qmin, qmax) * s`` with ``s = amax / qmax`` (straight-through gradient)."""
    return _kernels.fake_quant_forward(x, amax.detach(), qmin, qmax)[0]


@torch.library.custom_op("trtqat::fake_quant_grad", mutates_args=())
def fake_quant_grad(grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor, qmin: int,
                    qmax: int) -> torch.Tensor:
    """``grad`` where ``x`` was not clipped, 0 elsewhere."""
    return _kernels.fake_quant_grad_input(grad, x, amax, qmin, qmax)


@torch.library.custom_op("trtqat::fake_quant_learnable_grad", mutates_args=())
def fake_quant_learnable_grad(grad: torch.Tensor, x: torch.Tensor, amax: torch.Tensor,
                              qmin: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_x, grad_amax)`` of fake quantization with a learned ``amax``."""
    return _kernels.fake_quant_learnable_grad(grad, x, amax, qmin, qmax)


@fake_quant.register_fake
def _fake_quant_meta(x, amax, qmin, qmax):
    register_inductor_decompositions()
    return torch.empty_like(x)


@fake_quant_grad.register_fake
def _fake_quant_grad_meta(grad, x, amax, qmin, qmax):
    return torch.empty_like(grad)


@fake_quant_learnable_grad.register_fake
def _fake_quant_learnable_grad_meta(grad, x, amax, qmin, qmax):
    return torch.empty_like(grad), torch.empty_like(amax)


def _setup_context(ctx, inputs, output) -> None:
    x, amax, qmin, qmax = inputs
    ctx.qbounds = (qmin, qmax)
    ctx.save_for_backward(x, amax)


def _backward(ctx, grad):
    x, amax = ctx.saved_tensors
    qmin, qmax = ctx.qbounds
    if ctx.needs_input_grad[1]:
        grad_x, grad_amax = fake_quant_learnable_grad(grad, x, amax.detach(), qmin, qmax)
        return grad_x, grad_amax, None, None
    return fake_quant_grad(grad, x, amax, qmin, qmax), None, None, None


fake_quant.register_autograd(_backward, setup_context=_setup_context)


# Out-of-place (functional) forms of the _fused formulas, as AOT autograd requires.
def _forward_decomposition(x, amax, qmin, qmax):
    scale = _fused.scale_of(amax, qmax)
    return (torch.round(x.float() / scale).clamp(qmin, qmax) * scale).to(x.dtype)


def _grad_decomposition(grad, x, amax, qmin, qmax):
    r = torch.round(x.float() / _fused.scale_of(amax, qmax))
    return grad * ((r >= qmin) & (r <= qmax)).to(grad.dtype)


def register_inductor_decompositions() -> bool:
    """Let inductor lower the operators to aten ops it can fuse (once; False if it cannot)."""
    global _DECOMPOSED
    if _DECOMPOSED:
        return True
    try:
        from torch._inductor import decomposition
    except Exception:  # inductor unavailable in this torch build: the ops stay opaque
        return False
    table = decomposition.decompositions
    table[torch.ops.trtqat.fake_quant.default] = _forward_decomposition
    table[torch.ops.trtqat.fake_quant_grad.default] = _grad_decomposition
    table[torch.ops.trtqat.fake_quant_learnable_grad.default] = _fused.learnable_grad
    # inductor caches a copy of the table the first time it compiles anything
    # (``fast_random_decomps``); a model compiled earlier in the process made that copy
    # without these entries, so drop it
    cached = getattr(decomposition, "fast_random_decomps", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    _DECOMPOSED = True
    return True

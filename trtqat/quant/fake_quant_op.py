"""``torch.ops.trtqat.fake_quant``: fake quantization as a registered custom operator.

This is what a quantizer calls while ``torch.compile`` traces it (eager mode keeps the
autograd functions of :mod:`.functional`, whose backward state is smaller). The operator has

* a real implementation: the fastest kernels for the tensor (:mod:`._kernels`: Triton on
  CUDA, compiled C++ for float32/bfloat16 CPU, else pure PyTorch) - used when a compiled
  graph keeps the operator (``backend="eager"`` / ``"aot_eager"``);
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

What a quantizer calls while traced is :func:`traced`: in training (a gradient wanted) the
operator inside a non-reentrant activation checkpoint, which marks its decomposed ops "prefer
recompute" for AOT autograd's partitioner. Left alone, the partitioner keeps each quantized
copy (the next layer's backward needs it), a bool clip mask and a bool ReLU mask (the ReLU
output itself is no longer kept by anyone): 1.18-1.32x the FP32 step's saved activations for
ResNet18/50. Recomputed, backward rebuilds the quantized copy and both masks from what is kept
anyway (the quantizer's input, or the convolution output it is computed from): 0.77-0.91x
(``benchmarks/qat_saved_memory.py``). Only the quantizers' own ops are marked (an unquantized
model compiles as before); the partitioner still decides the rest. Recomputing runs the same
elementwise formulas on the same inputs, so values and gradients do not change (bit-identical
in float32; under bf16 autocast inductor, by default, may skip a bf16 rounding inside a fused
kernel, and where it does depends on how the graph is partitioned: with
``torch._inductor.config.emulate_precision_casts`` they are bit-identical too).
:func:`set_recompute` (or ``TRTQAT_COMPILED_RECOMPUTE=0`` at import) turns it off.

Calibration is not traced: it stays eager.
"""

from __future__ import annotations

import os

import torch
from torch.utils.checkpoint import checkpoint

from trtqat.quant import _fused, _kernels

__all__ = ["fake_quant", "fake_quant_grad", "fake_quant_learnable_grad",
           "register_inductor_decompositions", "recompute", "set_recompute", "traced"]

_DECOMPOSED = False
_RECOMPUTE = os.environ.get("TRTQAT_COMPILED_RECOMPUTE", "").strip() != "0"


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


def recompute() -> bool:
    """Whether traced quantizers are recomputed in backward (see the module docstring)."""
    return _RECOMPUTE


def set_recompute(on: bool) -> bool:
    """Recompute traced quantizers in backward (True, the default) or let the partitioner
    keep their outputs and masks (False); returns the previous setting. Takes effect for
    graphs compiled afterwards (dynamo guards on it: a change recompiles)."""
    global _RECOMPUTE
    previous, _RECOMPUTE = _RECOMPUTE, bool(on)
    return previous


def traced(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """:func:`fake_quant` as a quantizer calls it under ``torch.compile``: in training,
    inside an activation checkpoint so that backward recomputes it (not under
    ``torch.export``, whose graphs are for inference and deployment)."""
    if (_RECOMPUTE and torch.is_grad_enabled() and (x.requires_grad or amax.requires_grad)
            and not torch.compiler.is_exporting()):
        return checkpoint(fake_quant, x, amax, qmin, qmax, use_reentrant=False,
                          preserve_rng_state=False)
    return fake_quant(x, amax, qmin, qmax)

"""Activation-aware scaling of INT4 weights (AWQ-style, "lite": one exponent per layer).

Input channels that carry large activations matter more to a Linear's output, so their
weight columns are scaled up before block quantization (more levels where it counts) and
the input is scaled down by as much: ``y = (x / s) @ (W * s)^T`` is the float layer, exactly
up to float rounding. Per layer, ``s = mean|x|^alpha`` (normalised around 1) with the
``alpha`` of :data:`ALPHAS` whose INT4 output on the calibration inputs is closest to the
float output (alpha 0: no scaling).

The scaling is part of the model from then on, in every variant: the weight parameter holds
``W * s`` and the layer's (switched-off) input quantizer multiplies its input by ``1 / s``
(its ``pre_quant_scale``; :class:`~trtqat.quant.blockwise.FormatOff` applies it), exported
as a float ``Mul`` before the MatMul.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from trtqat.errors import CalibrationError
from trtqat.quant.block_amax import blocks_of
from trtqat.quant.blockwise import FormatOff, is_block
from trtqat.quant.model_ops import disable_quantization, enable_quantization

ALPHAS = tuple(i / 10 for i in range(11))
_KEEP_ROWS = 512  # calibration input rows kept per layer to score each alpha


def _fq(w: torch.Tensor, block: int) -> torch.Tensor:
    blocks = blocks_of(w, block)
    scale = (blocks.abs().amax(-1, keepdim=True) / 7).clamp_min(torch.finfo(torch.float32).tiny)
    return ((blocks / scale).round().clamp(-7, 7) * scale).reshape(w.shape)


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules()
            if isinstance(getattr(m, "_input_quantizer", None), FormatOff)
            and is_block(getattr(m, "_weight_quantizer", None))
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2]


@torch.no_grad()
def apply_awq(model: nn.Module, run: Callable[[nn.Module, object], object],
              batches: Iterable) -> dict[str, float]:
    """Scale every INT4 Linear of ``model`` (after :func:`to_int4_weights`, before its amax
    is computed) by the alpha that fits ``batches`` best; ``run(model, batch)`` runs one
    batch. Returns each layer's alpha."""
    layers = _layers(model)
    stats: dict[str, list] = {n: [0.0, 0, []] for n, _ in layers}

    def hook(name):
        def pre(module, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            s = stats[name]
            s[0] = s[0] + x.abs().sum(0)
            s[1] += x.shape[0]
            kept = sum(t.shape[0] for t in s[2])
            if kept < _KEEP_ROWS:
                s[2].append(x[:_KEEP_ROWS - kept])
        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in layers]
    disable_quantization(model)
    try:
        seen = 0
        for batch in batches:
            run(model, batch)
            seen += 1
    finally:
        enable_quantization(model)
        for h in handles:
            h.remove()
    if not seen:
        raise CalibrationError("AWQ scaling got no data: give it at least one batch")
    alphas = {}
    for name, m in layers:
        total, rows, kept = stats[name]
        if not rows:
            continue
        mean = (total / rows).clamp_min(1e-6)
        x = torch.cat(kept)
        w = m.weight.detach().float()
        want = x @ w.T
        best, best_err = torch.ones_like(mean), None
        alphas[name] = 0.0
        for alpha in ALPHAS:
            s = mean.pow(alpha)
            s = s / (s.max() * s.min()).sqrt()
            err = float(((x / s) @ _fq(w * s, m._weight_quantizer.block_size).T - want)
                        .square().mean())
            if best_err is None or err < best_err:
                best, best_err, alphas[name] = s, err, alpha
        if alphas[name] > 0:
            m.weight.mul_(best.to(m.weight.dtype))
            m._input_quantizer.pre_quant_scale = 1.0 / best
    return alphas

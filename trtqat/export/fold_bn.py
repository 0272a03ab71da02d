"""Fold BatchNorm into the convolution before it, keeping weight quantization exact.

Folding scales output channel ``c`` of the weight by ``s_c = gamma_c / sqrt(var_c + eps)``.
A per-channel weight quantizer stays exact when its amax scales by ``|s_c|`` too: the step
``amax_c / 127`` scales by the same factor as the weights, so every integer code is the same
(negated where ``s_c < 0``); the dequantized weights are folded, so that no code sits on a
rounding tie. A per-tensor weight quantizer cannot follow a per-channel scale;
it is recalibrated to the folded weights' maximum, which changes its rounding (logged).

Which BatchNorm follows which conv comes from :mod:`trtqat.export.bn_pairs` (per-module
traces, then the calls of one forward, then ``nn.Sequential`` neighbours). Given example
inputs, every fold is checked: the folded conv (and what replaces the BatchNorm, e.g. the
activation of timm's ``BatchNormAct2d``) must reproduce the BatchNorm's output on the
conv's recorded input, else the fold is undone. What stays unfolded is said in one NOTE
line, with the reasons.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd

from trtqat.export.bn_pairs import (
    hook_pairs,
    is_bn_like,
    replacement,
    sequential_pairs,
    trace_pairs,
)
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def why_not(conv: nn.Module, bn: nn.Module) -> str:
    """Why ``bn`` cannot fold into ``conv`` ("" when it can)."""
    if getattr(bn, "running_mean", None) is None or getattr(bn, "running_var", None) is None:
        return "it uses batch statistics (track_running_stats=False)"
    transposed = isinstance(conv, _ConvTransposeNd)
    if transposed and conv.groups != 1:
        return "it follows a grouped ConvTranspose"
    out_ch = conv.weight.shape[1] if transposed else conv.weight.shape[0]
    if bn.running_mean.numel() != out_ch:
        return f"{bn.running_mean.numel()} features for {out_ch} conv channels"
    return ""


@torch.no_grad()
def fold_conv_bn(conv: _ConvNd, bn: _BatchNorm) -> bool:
    """Fold ``bn`` into ``conv`` in place (weights, bias, weight amax); False if impossible."""
    if why_not(conv, bn):
        return False
    transposed = isinstance(conv, _ConvTransposeNd)
    w = conv.weight
    out_ch = w.shape[1] if transposed else w.shape[0]
    scale = bn.running_var.double().add(bn.eps).rsqrt()
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    shift = -bn.running_mean.double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.double()
    shape = [1, -1] if transposed else [-1]
    shape += [1] * (w.dim() - len(shape))
    quantizer = getattr(conv, "_weight_quantizer", None)
    source = w
    if (isinstance(quantizer, TensorQuantizer) and quantizer._amax is not None
            and not quantizer.disabled and quantizer.amax.numel() == out_ch):
        # fold the weights PyTorch uses, the dequantized codes: (k * step) * s over
        # step * |s| is +-k up to float error, so no code sits on a rounding tie and flips
        # (folding the raw float weights flips the rare weight at a tie; one flipped code
        # shifts a whole channel, which deep untrained models amplify to many steps)
        source = quantizer(w)
    new_w = (source.double() * scale.reshape(shape)).to(w.dtype)
    bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(scale)
    new_b = (bias * scale + shift).to(w.dtype)
    conv.weight = nn.Parameter(new_w, requires_grad=w.requires_grad)
    conv.bias = nn.Parameter(new_b, requires_grad=w.requires_grad)
    if isinstance(quantizer, TensorQuantizer) and quantizer._amax is not None:
        amax = quantizer._amax.detach()
        if amax.numel() == out_ch:
            new_amax = (amax.double() * scale.abs().reshape(amax.shape)).to(amax.dtype)
            # a zero gamma zeroes its channel: any positive range represents it exactly
            new_amax = torch.where(new_amax > 0, new_amax, torch.ones_like(new_amax))
        else:
            new_amax = new_w.detach().abs().max().to(amax.dtype).reshape(amax.shape)
            log.warning("%s has a per-tensor weight quantizer: after folding BatchNorm its "
                        "amax is recalibrated, so its rounding changes; quantize weights per "
                        "channel for an exact fold", quantizer._name or "a conv")
        if isinstance(quantizer._amax, nn.Parameter):
            quantizer._amax.data = new_amax
        else:
            quantizer._amax = new_amax
    return True


def find_conv_bn_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """``(conv, bn)`` module names where the BatchNorm takes only that conv's output: from
    the per-module traces, and ``nn.Sequential`` neighbours inside modules FX cannot trace."""
    pairs, _, seen = trace_pairs(model)
    return pairs + [p for p in sequential_pairs(model) if p[1] not in seen and p not in pairs]


class _Float:
    """The quantizers a fold does not follow bypassed: every activation quantizer and the
    weight quantizers without a per-channel range (a per-channel range folds exactly, so
    those keep quantizing, as :func:`fold_conv_bn` folds the dequantized weights)."""

    def __init__(self, model: nn.Module) -> None:
        self.states = []
        for name, q in model.named_modules():
            if isinstance(q, TensorQuantizer):
                kept = (name.endswith("_weight_quantizer") and not q.disabled
                        and q._amax is not None and q._amax.numel() > 1)
                self.states.append((q, q._disabled, kept))

    def __enter__(self) -> None:
        for q, _, kept in self.states:
            q._disabled = not kept

    def __exit__(self, *exc: object) -> None:
        for q, disabled, _ in self.states:
            q._disabled = disabled


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


@torch.no_grad()
def _record(model: nn.Module, example: tuple, pairs: list[tuple[str, str]]) -> dict[str, tuple]:
    """bn name -> (the conv's input, the BatchNorm's output) of one forward on ``example``."""
    seen: dict[tuple[str, str], Any] = {}
    hooks = []

    def keep(key: tuple[str, str], value: Any) -> None:  # a hook returning a value replaces
        if key not in seen:                                # the module's output
            seen[key] = _clone(value)

    for conv_name, bn_name in pairs:
        conv, bn = model.get_submodule(conv_name), model.get_submodule(bn_name)
        hooks.append(conv.register_forward_hook(
            lambda m, a, o, n=conv_name: keep(("in", n), a[0])))
        hooks.append(bn.register_forward_hook(lambda m, a, o, n=bn_name: keep(("out", n), o)))
    try:
        with _Float(model):
            model(*example)
    finally:
        for h in hooks:
            h.remove()
    return {b: (seen[("in", c)], seen[("out", b)]) for c, b in pairs
            if ("in", c) in seen and ("out", b) in seen}


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape:
        return False
    if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
        return False  # a non-finite output reproduces nothing (and has no scale)
    scale = float(want.abs().max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5 * max(scale, 1.0)))


def _outputs(model: nn.Module, example: tuple) -> list[torch.Tensor]:
    with torch.no_grad(), _Float(model):
        out = model(*example)
    items = out.values() if isinstance(out, dict) else (out if isinstance(out, (list, tuple))
                                                        else [out])
    return [o for o in items if isinstance(o, torch.Tensor)]


def _snapshot(conv: nn.Module) -> dict[str, Any]:
    q = getattr(conv, "_weight_quantizer", None)
    amax = None if q is None or q._amax is None else q._amax.detach().clone()
    return {"weight": conv.weight, "bias": conv.bias, "amax": amax}


def _undo(model: nn.Module, conv_name: str, bn_name: str, bn: nn.Module, state: dict) -> None:
    conv = model.get_submodule(conv_name)
    conv.weight, conv.bias = state["weight"], state["bias"]
    q = getattr(conv, "_weight_quantizer", None)
    if state["amax"] is not None:
        if isinstance(q._amax, nn.Parameter):
            q._amax.data = state["amax"]
        else:
            q._amax = state["amax"]
    _set_module(model, bn_name, bn)


def fold_batchnorm(model: nn.Module, inplace: bool = False, example_inputs: Any = None,
                   notes: list[str] | None = None) -> nn.Module:
    """A copy of ``model`` (eval mode) with every conv -> BatchNorm pair folded.

    ``example_inputs`` (a tensor or tuple) lets the fold find pairs inside modules FX cannot
    trace and check each fold numerically (undone when the outputs move). BatchNorms that
    stay are named, with the reason, in one NOTE line (logged, and appended to ``notes``).
    """
    folded = model if inplace else copy.deepcopy(model)
    folded.eval()
    example = None if example_inputs is None else (
        (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs))
    pairs, reasons, seen = trace_pairs(folded)
    unseen = {n for n, m in folded.named_modules() if is_bn_like(m)} - seen
    guessed: list[tuple[str, str]] = []
    if unseen and example is not None:
        with _Float(folded):
            guessed = hook_pairs(folded, example, unseen)
    if unseen:
        guessed += [p for p in sequential_pairs(folded) if p[1] in unseen and p not in guessed]
    for name in unseen - {b for _, b in guessed}:
        reasons[name] = "it is inside a module FX cannot trace and no conv output reaches it"
    candidates = pairs + guessed
    recorded = _record(folded, example, candidates) if example is not None else {}
    before = _outputs(folded, example) if example is not None and guessed else None
    done: list[tuple[str, str, nn.Module, dict]] = []
    for conv_name, bn_name in candidates:
        conv, bn = folded.get_submodule(conv_name), folded.get_submodule(bn_name)
        new, why = replacement(bn)
        if new is None and bn_name not in recorded:
            reasons[bn_name] = why + " (no example inputs to check the fold)"
            continue
        if why_not(conv, bn):
            reasons[bn_name] = why_not(conv, bn)
            continue
        state = _snapshot(conv)
        fold_conv_bn(conv, bn)
        new = new if new is not None else nn.Identity()
        if bn_name in recorded:
            x, want = recorded[bn_name]
            with torch.no_grad(), _Float(folded):
                got = new(conv(x))
            if not _close(got, want):
                _undo(folded, conv_name, bn_name, bn, state)
                reasons[bn_name] = why or "the folded conv does not reproduce its output"
                continue
        _set_module(folded, bn_name, new)
        reasons.pop(bn_name, None)
        done.append((conv_name, bn_name, bn, state))
    if before is not None and not all(_close(a, b) for a, b in
                                      zip(_outputs(folded, example), before)):
        for conv_name, bn_name, bn, state in [d for d in done if d[:2] in guessed]:
            _undo(folded, conv_name, bn_name, bn, state)
            reasons[bn_name] = "folding it moved the model's outputs"
    _note(reasons, notes)
    log.debug("folded %d BatchNorm layers", len(done))
    return folded


def _note(reasons: dict[str, str], notes: list[str] | None) -> None:
    if not reasons:
        return
    counts = Counter(reasons.values())
    parts = []
    for why, n in counts.most_common():
        names = [b for b, r in reasons.items() if r == why]
        parts.append(f"{n} {why} ({', '.join(names[:3])}{', ...' if n > 3 else ''})")
    text = f"{len(reasons)} BatchNorm layer(s) stay unfolded: " + "; ".join(parts)
    log.warning("NOTE %s", text)
    if notes is not None and text not in notes:
        notes.append(text)

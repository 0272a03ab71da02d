"""Check rewritten modules on example inputs: with every quantizer off, a placed module must
compute what its original forward computes on the inputs it received. A module that does
not (a forward FX traced differently from how it runs) gets its original class back."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from trtqat.quant.placement.place import Placement
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger("trtqat.quant.placement")


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if not a.is_floating_point():
            return bool(torch.equal(a, b))
        scale = float(b.detach().abs().max()) if b.numel() else 0.0
        return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * max(scale, 1.0),
                                   equal_nan=True))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return type(a) is type(b)


@torch.no_grad()
def verify_placement(model: nn.Module, example_inputs: Any, placement: Placement) -> list[str]:
    """Restore the placed modules whose rewritten forward disagrees with the original on
    ``example_inputs`` (a tensor, a tuple of inputs or a dict); returns their names."""
    placed = {n: m for n, m in model.named_modules() if hasattr(type(m), "_trtqat_spec")}
    if not placed:
        return []
    calls: dict[str, tuple] = {}
    saved: dict[str, tuple] = {}
    hooks = []
    for name, module in placed.items():
        def hook(mod, args, kwargs, output, name=name):
            if name in saved:
                calls.setdefault(name, (saved.pop(name), output))

        def pre(mod, args, kwargs, name=name):
            saved.setdefault(name, (_clone(args), _clone(kwargs)))
        hooks.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(module.register_forward_hook(hook, with_kwargs=True))
    states = [(q, q._disabled) for q in model.modules() if isinstance(q, TensorQuantizer)]
    modes = {m: m.training for m in model.modules()}
    try:
        for q, _ in states:
            q._disabled = True
        model.eval()
        if isinstance(example_inputs, dict):
            model(**example_inputs)
        elif isinstance(example_inputs, (tuple, list)):
            model(*example_inputs)
        else:
            model(example_inputs)
        bad = []
        for name, ((args, kwargs), output) in calls.items():
            module = placed[name]
            base = type(module)._trtqat_base
            if not _close(output, base.forward(module, *args, **kwargs)):
                bad.append(name)
    finally:
        for h in hooks:
            h.remove()
        for q, disabled in states:
            q._disabled = disabled
        for m, mode in modes.items():
            m.training = mode
    for name in bad:
        _restore(model, placed[name], name, placement)
    if bad:
        log.warning("NOTE %d rewritten module(s) computed something else than their own "
                    "forward on the example inputs and keep their layers' Q/DQ only: %s",
                    len(bad), ", ".join(n or type(model).__name__ for n in bad[:6]))
    return bad


def _restore(model: nn.Module, module: nn.Module, name: str, placement: Placement) -> None:
    module.__class__ = type(module)._trtqat_base
    prefix = f"{name}." if name else ""
    kept = []
    for full, rule in placement.added:
        attr = full[len(prefix):] if full.startswith(prefix) else None
        if rule != "shared" and attr and "." not in attr and attr in module._modules:
            delattr(module, attr)
        else:
            kept.append((full, rule))
    placement.added[:] = kept

"""Re-parameterizable blocks (RepVGG, MobileOne, FastViT): one conv each before quantizing.

In their training form such blocks add a kxk conv+BN, a 1x1 conv+BN and an identity
BatchNorm; deployed, timm's ``reparameterize()`` (or ``switch_to_deploy()``) sums them into
one conv. Quantized in the training form, the identity BatchNorm cannot be folded and the
branch Add gets no Q/DQ, so the engine runs them in float. :func:`reparameterize` calls
the hooks the way ``timm.utils.reparameterize_model`` does (in place), before quantizers
are inserted: re-parameterizing afterwards would lose the calibration. ``fuse()`` methods
(Conv+BN pairs, which the export folds anyway, and Ultralytics heads, whose ``fuse``
changes outputs) are left alone.
"""

from __future__ import annotations

import inspect
from collections import Counter

from torch import nn

HOOKS = ("reparameterize", "switch_to_deploy")


def _hook(module: nn.Module):
    """The module's re-parameterization method, if it takes no argument."""
    for name in HOOKS:
        fn = getattr(module, name, None)
        if not callable(fn):
            continue
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params):  # a VAE's reparameterize(mu, logvar) is something else
            return fn
    return None


def _has_batchnorm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def training_form(model: nn.Module) -> list[str]:
    """The modules of ``model`` (below it) with a re-parameterization hook that still hold
    a BatchNorm: the training form, which an INT8 engine runs partly in float."""
    return [f"{name} ({getattr(type(m), '_trtqat_base', type(m)).__name__})"
            for name, m in model.named_modules()
            if name and _hook(m) is not None and _has_batchnorm(m)]


def _state(module: nn.Module) -> tuple:
    return tuple(module._modules), sum(1 for _ in module.parameters())


def reparameterize(model: nn.Module) -> Counter[str]:
    """Call every child's re-parameterization hook, parents first, in place (as timm's
    ``reparameterize_model(model, inplace=True)`` minus ``fuse()``). Returns how many
    modules changed, by class name."""
    changed: Counter[str] = Counter()

    def visit(parent: nn.Module) -> None:
        for child in list(parent.children()):
            hook = _hook(child)
            if hook is not None:
                before = _state(child)
                hook()
                if _state(child) != before:
                    changed[type(child).__name__] += 1
            visit(child)

    visit(model)
    return changed

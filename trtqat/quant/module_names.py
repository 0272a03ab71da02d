"""The dotted name of a module inside the model that holds it, found when an error needs it.

A TensorQuantizer knows its name once ``quantize()`` / ``name_quantizers()`` ran; one built
under ``quant_modules.initialize()`` does not. When such a quantizer has to name itself in an
error, :func:`name_all_quantizers` climbs from it to the model that holds it (through the
``_modules`` dicts that refer to it) and names every quantizer of that model at once, so the
search runs once per model, on error paths only.
"""

from __future__ import annotations

import gc

from torch import nn

_MAX_DEPTH = 64
# torch.export wraps the model it traces in a module holding it as ``_export_root`` (and
# strips that prefix from the names it reports); a name found through it would be cached.
_TRACING_WRAPPERS = ("_export_root", "__export_root_")


def _parents(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """``(parent, attribute name)`` of every module holding ``module`` as a child."""
    found = []
    for holder in gc.get_referrers(module):
        if not isinstance(holder, dict):
            continue
        for owner in gc.get_referrers(holder):
            if isinstance(owner, dict):  # an instance __dict__ that holds the _modules dict
                owners = [o for o in gc.get_referrers(owner)
                          if isinstance(o, nn.Module) and getattr(o, "__dict__", None) is owner]
            else:
                owners = [owner]
            for parent in owners:
                if isinstance(parent, nn.Module) and parent.__dict__.get("_modules") is holder:
                    found += [(parent, key) for key, value in holder.items() if value is module]
    return found


def root_and_name(module: nn.Module) -> tuple[nn.Module, str]:
    """The outermost module holding ``module`` and the dotted name of ``module`` in it
    (``(module, "")`` when nothing holds it)."""
    parts: list[str] = []
    current = module
    seen = {id(module)}
    for _ in range(_MAX_DEPTH):
        parents = [(p, k) for p, k in _parents(current)
                   if id(p) not in seen and k not in _TRACING_WRAPPERS]
        if not parents:
            break
        current, key = parents[0]
        seen.add(id(current))
        parts.append(key)
    return current, ".".join(reversed(parts))


def name_all_quantizers(quantizer: nn.Module) -> str:
    """Name every unnamed quantizer of the model holding ``quantizer``; returns its name."""
    root, name = root_and_name(quantizer)
    if root is not quantizer:
        kind = type(quantizer)
        for sub_name, sub in root.named_modules(remove_duplicate=False):
            if isinstance(sub, kind) and not getattr(sub, "_name", ""):
                sub._name = sub_name
    return name


def quantizer_label(quantizer: nn.Module) -> str:
    """``quantizer 'layer1.0.conv1._input_quantizer'`` (named now if nothing named it yet),
    or ``TensorQuantizer`` when no model holds it."""
    if not getattr(quantizer, "_name", ""):
        name_all_quantizers(quantizer)
    name = getattr(quantizer, "_name", "")
    return f"quantizer '{name}'" if name else type(quantizer).__name__

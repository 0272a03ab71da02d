"""Which BatchNorm follows which convolution, found without tracing the whole model.

Three sources, most certain first:

* the per-module traces of :class:`trtqat.quant.placement.flow.ModelFlow`: a BatchNorm whose
  input is a conv's output, that conv's output read by nothing else and both called once
  (one untraceable module costs only its own pairs);
* the calls of one forward on example inputs (hooks): a BatchNorm called on the very tensor
  a conv returned, for BatchNorms inside modules FX cannot trace;
* ``nn.Sequential`` neighbours, which chain by construction.

Each BatchNorm kind has its replacement once folded: ``nn.Identity`` for plain BatchNorm
(and frozen / synchronised BatchNorm), the activation and dropout of timm's
``BatchNormAct2d``; other subclasses are folded only when a check on example inputs
proves the fold exact.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from trtqat.quant.placement.ops import is_batchnorm as is_bn_like

_PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def replacement(bn: nn.Module) -> tuple[nn.Module | None, str]:
    """What takes the BatchNorm's place once folded, and ``""``; or ``(None, why)`` when
    only a numeric check could tell (a subclass with its own forward)."""
    if type(bn) in _PLAIN or (not isinstance(bn, _BatchNorm) and is_bn_like(bn)
                              and "Frozen" in type(bn).__name__):
        return nn.Identity(), ""
    act, drop = getattr(bn, "act", None), getattr(bn, "drop", None)
    if isinstance(bn, _BatchNorm) and isinstance(act, nn.Module) and isinstance(drop, nn.Module):
        return nn.Sequential(drop, act), ""  # timm BatchNormAct2d: bn -> drop -> act
    return None, f"{type(bn).__name__} is a BatchNorm subclass with its own forward"


def trace_pairs(model: nn.Module) -> tuple[list[tuple[str, str]], dict[str, str], set[str]]:
    """``(pairs, reasons, seen)`` from the per-module traces: conv -> BatchNorm pairs, why
    other BatchNorms do not pair, and every BatchNorm a trace saw."""
    from trtqat.quant.placement.flow import ModelFlow

    flow = ModelFlow(model)
    calls = Counter({path: len(sites) for path, sites in flow.sites.items()})
    pairs, reasons, seen = [], {}, set()
    for path, trace in flow.traces.items():
        for node in trace.graph.nodes:
            bn = trace.node_module(node)
            if bn is None or not is_bn_like(bn):
                continue
            name = flow.path_of[id(bn)]
            seen.add(name)
            src = node.args[0] if node.args else None
            if len(node.args) != 1 or node.kwargs or not isinstance(src, fx.Node):
                reasons[name] = "called with more than its input"
                continue
            cpath, cnode = flow.resolve((path, src))
            conv = flow.module((cpath, cnode)) if cnode.op == "call_module" else None
            if not isinstance(conv, _ConvNd):
                what = cnode.target if cnode.op != "call_module" else type(conv).__name__
                reasons[name] = f"does not follow a convolution (its input: {_short(what)})"
                continue
            conv_name = flow.path_of[id(conv)]
            if len(flow.consumers((cpath, cnode))) != 1:
                reasons[name] = f"{conv_name}'s output is read by more than this BatchNorm"
            elif calls[conv_name] != 1 or calls[name] != 1:
                reasons[name] = "the conv or the BatchNorm is called more than once"
            else:
                pairs.append((conv_name, name))
    return pairs, reasons, seen


def _short(target: object) -> str:
    return getattr(target, "__name__", str(target))[:40]


@torch.no_grad()
def hook_pairs(model: nn.Module, example: tuple[Any, ...], names: set[str]
               ) -> list[tuple[str, str]]:
    """Pairs among the BatchNorms ``names``: each called once, on the tensor the one call
    of a conv returned, in one forward on ``example``."""
    outputs: dict[int, str] = {}
    keep: list[torch.Tensor] = []
    found: dict[str, list[str]] = {}
    hooks = []
    modules = dict(model.named_modules())

    def conv_hook(name):
        def hook(mod, args, out):
            outputs[id(out)] = name if id(out) not in outputs else ""
            keep.append(out)
        return hook

    def bn_hook(name):
        def hook(mod, args):
            found.setdefault(name, []).append(outputs.get(id(args[0]), "") if args else "")
        return hook

    for name, m in modules.items():
        if isinstance(m, _ConvNd):
            hooks.append(m.register_forward_hook(conv_hook(name)))
        elif name in names:
            hooks.append(m.register_forward_pre_hook(bn_hook(name)))
    try:
        model(*example)
    finally:
        for h in hooks:
            h.remove()
    conv_calls = Counter(v for v in outputs.values())
    return [(convs[0], bn) for bn, convs in found.items()
            if len(convs) == 1 and convs[0] and conv_calls[convs[0]] == 1]


def sequential_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """Adjacent ``conv, BatchNorm`` children of ``nn.Sequential`` containers."""
    pairs = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        for (cname, conv), (bname, bn) in zip(children, children[1:]):
            if isinstance(conv, _ConvNd) and is_bn_like(bn):
                prefix = f"{name}." if name else ""
                pairs.append((prefix + cname, prefix + bname))
    return pairs

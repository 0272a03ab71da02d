"""``describe(model)``: every quantizer of a model and the placement rule behind it,
read from the model itself (so it works on a loaded checkpoint too)."""

from __future__ import annotations

from torch import nn

from trtqat.quant.model_ops import quantizer_names
from trtqat.quant.placement.rules import RULE_TEXT

_BY_NAME = (("residual_quantizer", "residual-add"), ("concat_quantizer", "concat"),
            ("pool_quantizer", "maxpool"), ("matmul_qk", "attention"),
            ("matmul_av", "attention"), ("matmul", "matmul"), ("sdpa", "sdpa"))


def rule_of(name: str) -> str:
    """The rule a quantizer's name says placed it (``layer`` for layer quantizers)."""
    parts = name.split(".")
    if "_trtqat_calls" in parts:  # a call site of a module FX cannot trace
        return "calls"
    for part in reversed(parts):
        for key, rule in _BY_NAME:
            if part == key or part.startswith(key + "_"):
                return rule
    return "layer"


def owners(names: list[str]) -> list[str]:
    """The layers of quantizer names (``fc._input_quantizer`` -> ``fc``); rule quantizers
    (``layer1.0.residual_quantizer``) are their own owners."""
    out = [n.rsplit(".", 1)[0] if n.endswith(("._input_quantizer", "._weight_quantizer",
                                              "._other_quantizer")) else n for n in names]
    return list(dict.fromkeys(out))


def describe_lines(model: nn.Module) -> list[str]:
    """``name  [rule] what it does (state)`` per quantizer; a quantizer shared by several
    names is listed once with its other names."""
    names, objs = quantizer_names(model)
    lines = []
    for key, all_names in names.items():
        first = all_names[0]
        rule = rule_of(first)
        shared = f"; shared with {', '.join(all_names[1:])}" if len(all_names) > 1 else ""
        state = "disabled" if objs[key].disabled else (
            "calibrated" if objs[key]._amax is not None else "uncalibrated")
        lines.append(f"{first}  [{rule}] {RULE_TEXT.get(rule, rule)} ({state}{shared})")
    return lines


def describe(model: nn.Module) -> str:
    """The placement of ``model`` as text, one quantizer a line."""
    return "\n".join(describe_lines(model))

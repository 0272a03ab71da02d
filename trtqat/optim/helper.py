"""``optim.helper``: pick parameters by name for optimizer groups, freezing, in-place quant."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from trtqat.errors import QuantTypeError

log = logging.getLogger(__name__)


def match_parameters(model: nn.Module, patterns: Iterable[str]) -> Iterator[nn.Parameter]:
    """Yield each parameter once per regex in ``patterns`` that its name contains (re.search)."""
    patterns = list(patterns)
    for name, param in model.named_parameters():
        for pattern in patterns:
            if re.search(pattern, name):
                yield param


def _per_group(values: Sequence | None, n: int, what: str) -> Sequence | None:
    if values is not None and len(values) != n:
        raise QuantTypeError(f"len({what}) must match len(patterns_list) ({len(values)} != {n})")
    return values


def group_parameters(model: nn.Module, patterns_list: Sequence[list[str]],
                     lrs: Sequence[float] | None = None, momentums: Sequence[float] | None = None,
                     weight_decays: Sequence[float] | None = None) -> list[dict]:
    """Optimizer parameter groups, one per list of patterns (patterns must not overlap).

    ``lrs``, ``momentums`` and ``weight_decays`` (one value per group) are added to the
    groups. Raises TypeError when ``patterns_list`` is not a list of lists or a list of
    values has the wrong length.
    """
    groups = []
    for patterns in patterns_list:
        if not isinstance(patterns, list):
            raise QuantTypeError("patterns_list must be list of list of patterns, e.g. [[\"conv1\"], [\"fc\"]]")
        groups.append({"params": match_parameters(model, patterns)})
    for key, values, what in (("lr", lrs, "lrs"), ("momentum", momentums, "momentums"),
                              ("weight_decay", weight_decays, "weight_decays")):
        for group, value in zip(groups, _per_group(values, len(groups), what) or ()):
            group[key] = value
    return groups


def freeze_parameters(model: nn.Module, patterns: Iterable[str]) -> None:
    """``requires_grad = False`` for every parameter whose name contains one of ``patterns``."""
    patterns = list(patterns)
    for name, param in model.named_parameters():
        if any(re.search(p, name) for p in patterns):
            log.info("freeze %s", name)
            param.requires_grad = False


def quant_weight_inplace(model: nn.Module) -> None:
    """Replace the weight of every layer with a weight quantizer by its quantized value."""
    for name, module in model.named_modules():
        quantizer = getattr(module, "_weight_quantizer", None)
        if quantizer is None:
            continue
        if not quantizer.fake_quant:
            log.warning("%s: in-place real quantization leaves integer codes in the weight", name)
        with torch.no_grad():
            module.weight.data.copy_(quantizer(module.weight))

"""Model families behind one interface (:class:`ModelFamily`), found by name in a registry.

``of_model("minilm")``, ``of_checkpoint(ckpt)`` and ``get("cnn")`` return the family object;
stage code calls its hooks and never tests a family name itself.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from trtqat.errors import TrtqatError
from trtqat.families.base import EngineHints, ExportInputs, ModelFamily
from trtqat.families.registry import FAMILIES


class UnknownFamilyError(TrtqatError, ValueError):
    """No registered family has the given name."""


@cache
def get(name: str) -> ModelFamily:
    """The registered family called ``name``."""
    for key, target in FAMILIES:
        if key == name:
            module, cls = target.split(":")
            return getattr(importlib.import_module(module), cls)()
    raise UnknownFamilyError(f"unknown model family {name!r}: use one of {', '.join(names())}")


def names() -> list[str]:
    """Registered family names, in claiming order."""
    return [key for key, _ in FAMILIES]


def all_families() -> list[ModelFamily]:
    """Every registered family, in claiming order."""
    return [get(key) for key in names()]


def of_model(model: str) -> ModelFamily:
    """The family of ``--model MODEL`` (the first that claims it; CNN is the fallback)."""
    for family in all_families():
        if family.claims_model(model):
            return family
    return get("cnn")


def of_checkpoint(ckpt: dict[str, Any]) -> ModelFamily:
    """The family of a loaded checkpoint (its ``model.family`` tag; CNN when untagged)."""
    for family in all_families():
        if family.claims_checkpoint(ckpt):
            return family
    return get("cnn")


__all__ = ["EngineHints", "ExportInputs", "ModelFamily", "UnknownFamilyError", "all_families",
           "get", "names", "of_checkpoint", "of_model"]

"""Package attributes imported on first access (PEP 562), so that importing a package that
only needs its torch-free parts (engines, registries, the CLI) does not load torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str], submodules: Iterable[str] = ()
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps an attribute to the module
    defining it; ``submodules`` are subpackages reachable as attributes before any import.

        __getattr__, __dir__ = lazy_attributes(__name__, {"quantize": "trtqat.quant.model_ops"})
    """
    subs = tuple(submodules)

    def __getattr__(name: str) -> Any:
        module = importlib.import_module(package)
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(module, name, value)
            return value
        if name in subs:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names) | set(subs))

    return __getattr__, __dir__

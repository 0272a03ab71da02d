"""Monkey-patch torch.nn so that models built afterwards contain Quant* modules.

    from trtqat import quant_modules
    quant_modules.initialize()
    model = torchvision.models.resnet50()   # QuantConv2d, QuantLinear, ...
    quant_modules.deactivate()

or, scoped: ``with quant_modules.initialized(): model = resnet50()``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.quant import modules as qm


class _Entry(NamedTuple):
    orig_mod: object
    mod_name: str
    replace_mod: type


DEFAULT_QUANT_MAP: list[_Entry] = [
    _Entry(nn, "Conv1d", qm.QuantConv1d),
    _Entry(nn, "Conv2d", qm.QuantConv2d),
    _Entry(nn, "Conv3d", qm.QuantConv3d),
    _Entry(nn, "ConvTranspose1d", qm.QuantConvTranspose1d),
    _Entry(nn, "ConvTranspose2d", qm.QuantConvTranspose2d),
    _Entry(nn, "ConvTranspose3d", qm.QuantConvTranspose3d),
    _Entry(nn, "Linear", qm.QuantLinear),
    _Entry(nn, "AvgPool1d", qm.QuantAvgPool1d),
    _Entry(nn, "AvgPool2d", qm.QuantAvgPool2d),
    _Entry(nn, "AvgPool3d", qm.QuantAvgPool3d),
    _Entry(nn, "AdaptiveAvgPool1d", qm.QuantAdaptiveAvgPool1d),
    _Entry(nn, "AdaptiveAvgPool2d", qm.QuantAdaptiveAvgPool2d),
    _Entry(nn, "AdaptiveAvgPool3d", qm.QuantAdaptiveAvgPool3d),
]

_lock = threading.Lock()
_saved: list[tuple[object, str, object]] = []  # (module, attribute, original value)


def is_active() -> bool:
    """True between initialize() and deactivate()."""
    return bool(_saved)


def initialize(float_module_list: Iterable[str] | None = None,
               custom_quant_modules: Iterable[tuple[object, str, type]] | None = None) -> None:
    """Replace torch.nn layer classes by their Quant* versions.

    Args:
        float_module_list: names of torch.nn classes to leave in float, e.g. ``["Linear"]``.
        custom_quant_modules: extra ``(module, "ClassName", QuantClass)`` replacements.
    """
    skip = set(float_module_list or ())
    known = {e.mod_name for e in DEFAULT_QUANT_MAP}
    unknown = skip - known
    if unknown:
        raise QuantConfigError(
            f"float_module_list names {sorted(unknown)}, which initialize() does not replace; "
            f"choose from {sorted(known)}"
        )
    entries = [e for e in DEFAULT_QUANT_MAP if e.mod_name not in skip]
    for item in custom_quant_modules or ():
        if len(item) != 3 or not hasattr(item[0], item[1]):
            raise QuantConfigError(
                f"custom_quant_modules entry {item!r} must be (module, 'ClassName', QuantClass) "
                "with ClassName an attribute of module"
            )
        entries.append(_Entry(*item))
    with _lock:
        if _saved:
            raise QuantConfigError(
                "quant_modules.initialize() is already active; call deactivate() first"
            )
        for e in entries:
            _saved.append((e.orig_mod, e.mod_name, getattr(e.orig_mod, e.mod_name)))
            setattr(e.orig_mod, e.mod_name, e.replace_mod)


def deactivate() -> None:
    """Restore every class that initialize() replaced."""
    with _lock:
        while _saved:
            mod, name, orig = _saved.pop()
            setattr(mod, name, orig)


@contextlib.contextmanager
def initialized(float_module_list: Iterable[str] | None = None,
                custom_quant_modules: Iterable[tuple[object, str, type]] | None = None) -> Iterator[None]:
    """``initialize()`` for the duration of a ``with`` block, then ``deactivate()``."""
    initialize(float_module_list, custom_quant_modules)
    try:
        yield
    finally:
        deactivate()



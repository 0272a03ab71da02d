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


# torch.nn.Conv2d -> QuantConv2d, ...: the layers quantize() replaces too. One list, also
# under pytorch-quantization's names (programs read and extend ``_DEFAULT_QUANT_MAP`` with
# ``_quant_entry(module, "Name", QuantClass)``; initialize() applies what it holds then).
DEFAULT_QUANT_MAP: list[_Entry] = [_Entry(nn, float_cls.__name__, quant_cls)
                                   for float_cls, quant_cls in qm.FLOAT_TO_QUANT.items()]
_DEFAULT_QUANT_MAP = DEFAULT_QUANT_MAP
_quant_entry = _Entry

_lock = threading.Lock()


class QuantModuleReplacementHelper:
    """Swaps torch.nn classes for their Quant* versions and back (pytorch-quantization's helper).

    Attributes:
        orginal_func_map: ``(module, name, original class)`` entries to restore (the
            misspelling is pytorch-quantization's).
        default_quant_map: the built-in replacements (:data:`DEFAULT_QUANT_MAP`).
        quant_map: the replacements :meth:`apply_quant_modules` makes.
    """

    def __init__(self) -> None:
        self.orginal_func_map: list[_Entry] = []
        self.default_quant_map: list[_Entry] = DEFAULT_QUANT_MAP
        self.quant_map: list[_Entry] = []

    def prepare_state(self, float_module_list: Iterable[str] | None = None,
                      custom_map: Iterable[tuple[object, str, type]] | None = None) -> None:
        """Choose the replacements: the defaults minus ``float_module_list``, plus ``custom_map``."""
        skip = set(float_module_list or ())
        entries = [e for e in self.default_quant_map if e.mod_name not in skip]
        for item in custom_map or ():
            if len(item) != 3 or not hasattr(item[0], item[1]):
                raise QuantConfigError(
                    f"custom_quant_modules entry {item!r} must be (module, 'ClassName', "
                    "QuantClass) with ClassName an attribute of module")
            entries.append(_Entry(*item))
        for e in entries:
            self.quant_map.append(e)
            self.orginal_func_map.append(_Entry(e.orig_mod, e.mod_name, getattr(e.orig_mod, e.mod_name)))

    def apply_quant_modules(self) -> None:
        """Monkey-patch every chosen class."""
        for e in self.quant_map:
            setattr(e.orig_mod, e.mod_name, e.replace_mod)

    def restore_float_modules(self) -> None:
        """Put every replaced class back."""
        for e in reversed(self.orginal_func_map):
            setattr(e.orig_mod, e.mod_name, e.replace_mod)


_active: list[QuantModuleReplacementHelper] = []  # the helper of the running initialize()


def is_active() -> bool:
    """True between initialize() and deactivate()."""
    return bool(_active)


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
    helper = QuantModuleReplacementHelper()
    helper.prepare_state(skip, custom_quant_modules)
    with _lock:
        if _active:
            raise QuantConfigError(
                "quant_modules.initialize() is already active; call deactivate() first"
            )
        helper.apply_quant_modules()
        _active.append(helper)


def deactivate() -> None:
    """Restore every class that initialize() replaced."""
    with _lock:
        while _active:
            _active.pop().restore_float_modules()


@contextlib.contextmanager
def initialized(float_module_list: Iterable[str] | None = None,
                custom_quant_modules: Iterable[tuple[object, str, type]] | None = None) -> Iterator[None]:
    """``initialize()`` for the duration of a ``with`` block, then ``deactivate()``."""
    initialize(float_module_list, custom_quant_modules)
    try:
        yield
    finally:
        deactivate()


@contextlib.contextmanager
def enable_onnx_export() -> Iterator[None]:
    """Within this block quantizers emit ONNX-exportable fake-quantize ops (Q/DQ)."""
    from trtqat.quant import export_mode

    with export_mode.enabled(strict=False):  # pytorch-quantization's: uncalibrated warns
        yield

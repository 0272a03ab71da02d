"""Value checks shared by the command line and the Python API (torch-free).

The CLI's ``type=`` validators (:mod:`trtqat.cli.validate`) check strings; these check the
values the Python API is handed, with the same one-line messages: which key, what type it
takes and what was given.

    check_config_types(cfg)             # every bool / int / float / str field of a dataclass
    check_module(model, "quantize")     # a torch.nn.Module, not a model name
    check_keys("QuantConfig", config, valid, QuantConfigError)  # unknown: "did you mean"
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

from trtqat.errors import TrtqatError


class ValueTypeError(TrtqatError, TypeError):
    """A value of the wrong type for its key (a string where a number goes, ...)."""


class ModelTypeError(TrtqatError, TypeError):
    """Something that is not a ``torch.nn.Module`` where a model is expected."""


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


# annotation (as written under ``from __future__ import annotations``) -> (test, wording)
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bool": (_is_bool, "a bool (True or False)"),
    "int": (_is_int, "an integer"),
    "float": (_is_float, "a finite number"),
    "str": (_is_str, "a string"),
}


def check_type(owner: str, key: str, value: Any, kind: str, *, none_ok: bool = False,
               error: type[TrtqatError] = ValueTypeError) -> None:
    """Raise ``error`` (:class:`ValueTypeError`) unless ``value`` is of ``kind`` (``bool``: only True or
    False; ``int``: an integer, not a bool; ``float``: a finite int or float, not a string;
    ``str``), or None when ``none_ok``."""
    if value is None and none_ok:
        return
    test, wording = _KINDS[kind]
    if not test(value):
        also = " or None" if none_ok else ""
        raise error(f"{owner}.{key} must be {wording}{also}, got {value!r} "
                    f"({type(value).__name__})")


def _kind_of(annotation: Any) -> tuple[str, bool] | None:
    """``'int | None'`` -> ('int', True); None for annotations checked elsewhere."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    parts = [p.strip() for p in str(text).split("|")]
    none_ok = "None" in parts
    kinds = [p for p in parts if p != "None"]
    if len(kinds) == 1 and kinds[0] in _KINDS:
        return kinds[0], none_ok
    return None


def check_config_types(config: Any, owner: str | None = None, skip: Iterable[str] = (),
                       error: type[TrtqatError] = ValueTypeError) -> None:
    """Type-check every field of the dataclass instance ``config`` annotated ``bool``,
    ``int``, ``float`` or ``str`` (optionally ``| None``), see :func:`check_type`."""
    owner = owner or type(config).__name__
    skipped = set(skip)
    for f in dataclasses.fields(config):
        found = _kind_of(f.type)
        if found is not None and f.name not in skipped:
            check_type(owner, f.name, getattr(config, f.name), found[0], none_ok=found[1],
                       error=error)


def check_keys(owner: str, given: Iterable[Any], valid: Iterable[str],
               error: type[TrtqatError]) -> None:
    """Raise ``error`` for the first key of ``given`` not in ``valid``: one line with the
    closest valid key ("did you mean") and all of them."""
    allowed = list(valid)
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise error(f"unknown {owner} key {key!r}: {hint}valid keys: {', '.join(allowed)}")


def check_module(model: Any, verb: str) -> None:
    """Raise :class:`ModelTypeError` unless ``model`` is a ``torch.nn.Module``; a string
    (a model name) gets how to build one."""
    from torch import nn

    if isinstance(model, nn.Module):
        return
    hint = ""
    if isinstance(model, str):
        hint = (f"; build the model first, e.g. model = torchvision.models.get_model("
                f"{model!r}), or use the command line (trtqat calibrate --model {model})")
    raise ModelTypeError(f"{verb}() takes a torch.nn.Module, got {type(model).__name__} "
                         f"{model!r:.60}{hint}")

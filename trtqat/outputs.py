"""Model outputs of any structure: a tensor, a tuple or list, a dict, nested.

:func:`flatten` names every leaf the way the ONNX export names its outputs (``output``
for a single tensor, ``output_<i>`` for tuple items, dict keys, nested parts joined by
``_``); :func:`select` picks the output a metric scores (the first unless
``--metric-output NAME|INDEX`` names another). Torch-free: leaves are whatever is not a
tuple, list or dict.
"""

from __future__ import annotations

from typing import Any

from trtqat.errors import TrtqatError


class OutputSelectionError(TrtqatError, ValueError):
    """``--metric-output`` names no output of the model."""


def flatten(out: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(name, leaf)`` for every leaf of ``out``, in the order the ONNX export writes them."""
    if isinstance(out, dict):
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"output_{i}" if not prefix else str(i), v) for i, v in enumerate(out)]
    else:
        return [(prefix or "output", out)]
    found: list[tuple[str, Any]] = []
    for key, value in items:
        found += flatten(value, f"{prefix}_{key}" if prefix else key)
    return found


def leaves(out: Any) -> list[Any]:
    """The leaves of ``out`` (see :func:`flatten`)."""
    return [v for _, v in flatten(out)]


def select(out: Any, which: str | int | None = None) -> Any:
    """The output a metric scores: the first leaf, or the one ``which`` names (an output
    name or an index, given as int or digits)."""
    named = flatten(out)
    if which is None or which == "":
        return named[0][1]
    if isinstance(which, int) or str(which).lstrip("-").isdigit():
        index = int(which)
        if -len(named) <= index < len(named):
            return named[index][1]
    else:
        for name, value in named:
            if name == which:
                return value
    raise OutputSelectionError(f"--metric-output {which}: the model returns "
                               f"{', '.join(n for n, _ in named)}; name one of them or give "
                               f"an index below {len(named)}")


def scoring(which: str | int | None):
    """A forward hook that makes a model return the output :func:`select` picks (for
    training, calibration and evaluation loops that expect one tensor)."""

    def hook(module: Any, args: Any, out: Any) -> Any:
        if isinstance(out, (tuple, list, dict)):
            return select(out, which)
        return None

    return hook

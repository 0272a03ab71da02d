"""``utils.amp_wrapper``: apex-amp decorators, as pass-throughs.

pytorch-quantization forwards these to ``apex.amp`` when apex is installed. trtqat does not
depend on apex (``torch.autocast`` replaced it), so they return the function unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def half_function(fn: F) -> F:
    """``fn`` unchanged (apex would run it in fp16)."""
    return fn


def float_function(fn: F) -> F:
    """``fn`` unchanged (apex would run it in fp32)."""
    return fn


def promote_function(fn: F) -> F:
    """``fn`` unchanged (apex would promote its inputs to the widest type)."""
    return fn

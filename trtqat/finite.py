"""Finiteness checks shared by checkpoints, export, build and compare.

No NaN or infinite value passes a check: a model whose parameters, buffers or outputs are
not finite is refused, naming the first offending tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from trtqat.errors import TrtqatError


class NonFiniteError(TrtqatError, ValueError):
    """A model, checkpoint or output holds NaN or infinite values."""


def _count_bad(value: Any) -> tuple[int, int]:
    """(non-finite elements, elements) of a tensor or array; (0, 0) for non-float data."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        if not (value.is_floating_point() or value.is_complex()):
            return 0, 0
        import torch

        bad = int((~torch.isfinite(value.detach())).sum())
        return bad, int(value.numel())
    arr = np.asarray(value)
    if arr.dtype.kind not in "fc":
        return 0, 0
    return int((~np.isfinite(arr)).sum()), int(arr.size)


def first_non_finite(named: Iterable[tuple[str, Any]]) -> tuple[str, int, int] | None:
    """The first ``(name, non-finite count, size)`` of ``(name, tensor or array)`` pairs
    holding NaN or inf, or None if every value is finite. Integer tensors are skipped."""
    for name, value in named:
        if value is None:
            continue
        bad, size = _count_bad(value)
        if bad:
            return name, bad, size
    return None


def describe(found: tuple[str, int, int]) -> str:
    """``'x' holds 3 of 10 non-finite values (NaN/inf)``."""
    name, bad, size = found
    return f"'{name}' holds {bad} of {size} non-finite values (NaN/inf)"


def model_tensors(model: Any) -> Iterable[tuple[str, Any]]:
    """Every parameter and buffer of a ``torch.nn.Module`` (its state dict, with buffers
    that are not persistent too)."""
    yield from model.named_parameters()
    yield from model.named_buffers()


def check_finite_arrays(named: Iterable[tuple[str, Any]], what: str, fix: str) -> None:
    """Raise :class:`NonFiniteError` if one of the named tensors/arrays holds NaN or inf."""
    found = first_non_finite(named)
    if found is not None:
        raise NonFiniteError(f"{what} is not finite: {describe(found)}; {fix}")


def onnx_initializers(model: Any) -> Iterable[tuple[str, Any]]:
    """``(name, array)`` of every float initializer of an ``onnx.ModelProto`` (and of its
    ``Constant`` nodes)."""
    from onnx import numpy_helper

    for init in model.graph.initializer:
        yield init.name, numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    yield node.output[0], numpy_helper.to_array(attr.t)

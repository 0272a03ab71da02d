"""``utils.reduce_amax``: the absolute maximum of a tensor over some dimensions."""

from __future__ import annotations

import torch

from trtqat.errors import QuantConfigError


def reduce_amax(input: torch.Tensor, axis: int | tuple[int, ...] | list[int] | None = None,
                keepdims: bool = True) -> torch.Tensor:
    """``max(|input|)`` over ``axis`` (all dimensions when None), without gradient.

    As in pytorch-quantization: ``axis=None`` gives a 0-d tensor; an int axis keeps that
    dimension with length 1 when ``keepdims``; a tuple or list of axes keeps them all with
    length 1 unless ``keepdims`` is False or one value remains (then it is squeezed).

    Raises:
        ValueError: more axes than the tensor has dimensions.
    """
    with torch.no_grad():
        out = input.abs()
        if axis is None:
            return out.max()
        if isinstance(axis, int):
            return out.amax(dim=axis, keepdim=keepdims)
        if len(axis) > input.dim():
            raise QuantConfigError(f"Cannot reduce more axes ({len(axis)}) than the tensor's "
                                   f"{input.dim()} dimensions")
        if len(axis):
            out = out.amax(dim=tuple(axis), keepdim=True)
        if not keepdims or out.numel() == 1:
            out = out.squeeze()
        return out

"""Checks and shapes of a quantizer's range (amax)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from trtqat.errors import AmaxValueError, QuantTypeError


def broadcasts(amax_shape: torch.Size, input_shape: torch.Size) -> bool:
    """True if an amax of ``amax_shape`` broadcasts to ``input_shape`` without growing it.

    Plain Python on the sizes (every quantizer call checks it; ``torch.broadcast_shapes``
    cost more than the fake-quant kernel itself on small layers)."""
    if len(amax_shape) > len(input_shape):  # broadcasting would add dimensions
        return False
    return all(int(a) == 1 or int(a) == int(b)
               for a, b in zip(reversed(amax_shape), reversed(input_shape)))


@functools.lru_cache(maxsize=1024)
def fits(amax_shape: torch.Size, input_shape: torch.Size) -> bool:
    """:func:`broadcasts`, remembered per pair of shapes (a training step repeats its shapes)."""
    return broadcasts(amax_shape, input_shape)


ALL_ZERO = "amax is 0, so nothing can be represented"


def checked_amax(value, label: str | Callable[[], str]) -> torch.Tensor:
    """``value`` as a float32 tensor; TypeError if not numeric, ValueError if it cannot be a
    range (empty, NaN, infinite, negative or all zero). ``label`` (or what it returns, asked
    only for an error) names the quantizer in the message."""
    try:
        return _checked(value)
    except (QuantTypeError, AmaxValueError) as exc:
        name = label() if callable(label) else label
        text = str(exc)
        if text.startswith(ALL_ZERO) and "_weight_quantizer" in name:  # no data would help
            text = (f"{ALL_ZERO}: the layer's weights are all zero (an untrained, "
                    "zero-initialised layer, such as a new torchvision ViT head); load or "
                    "train its weights first, or keep the layer in float (skip_layers)")
        raise type(exc)(f"{name}: {text}") from exc.__cause__


def _checked(value) -> torch.Tensor:
    try:
        amax = (value.detach().float().clone() if isinstance(value, torch.Tensor)
                else torch.tensor(value, dtype=torch.float32))
    except (TypeError, ValueError, RuntimeError) as err:
        raise QuantTypeError(f"amax must be numeric, got {value!r}") from err
    if amax.numel() == 0:
        raise AmaxValueError("amax is empty")
    if not bool(torch.isfinite(amax).all()):
        raise AmaxValueError(
            "amax contains NaN or inf; the calibration data or the weights hold "
            "non-finite values - check the inputs and recalibrate")
    if bool((amax < 0).any()):
        raise AmaxValueError(f"amax is negative ({amax.min().item():g}); amax is a "
                             "magnitude and must be > 0")
    if bool((amax == 0).all()):
        raise AmaxValueError(f"{ALL_ZERO}; calibrate on data that reaches this layer, or "
                             "disable this quantizer")
    return amax


def store_amax(quantizer: nn.Module, value: torch.Tensor) -> None:
    """Set a quantizer's checked ``value`` as its amax: copied into a learned amax of the same
    shape, else kept (on the device of the amax it replaces)."""
    current = quantizer._amax
    if isinstance(current, nn.Parameter):
        with torch.no_grad():
            if current.shape == value.shape:
                current.copy_(value)
            else:
                quantizer._amax = nn.Parameter(value.to(current.device))
    elif current is None:
        quantizer._amax = value
    else:
        quantizer._amax = value.to(current.device)


def shape_buffers_for(quantizer: nn.Module, state_dict: dict, prefix: str) -> None:
    """Before a state dict is loaded into ``quantizer``: give its ``_amax`` and
    ``_pre_quant_scale`` the shapes of the state dict's (a learned amax takes the value)."""
    for key in ("_amax", "_pre_quant_scale"):
        value = state_dict.get(prefix + key)
        if value is None:
            continue
        value = value.detach().float()
        if key == "_amax" and isinstance(quantizer._amax, nn.Parameter):
            store_amax(quantizer, value)
        else:
            current = getattr(quantizer, key)
            device = current.device if current is not None else value.device
            setattr(quantizer, key, torch.empty(value.shape, device=device))

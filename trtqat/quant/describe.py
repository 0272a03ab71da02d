"""The one-line summary of a TensorQuantizer that ``repr(model)`` shows."""

from __future__ import annotations

from typing import Any


def describe(q: Any) -> str:
    """Bits, range, mode, axis, amax, switches of the TensorQuantizer ``q`` (its ``extra_repr``)."""
    if q._disabled:
        return "disabled"
    parts = [f"{'unsigned ' if q._unsigned else ''}{q._num_bits}bit"]
    parts += ["narrow"] if q._narrow_range else []
    parts += ["fake" if q._fake_quant else "real"]
    parts += ["per-tensor" if q._axis is None else f"axis={q._axis}"]
    amax = q._amax
    if amax is None:
        parts.append("amax=dynamic")
    elif amax.numel() == 1:
        parts.append(f"amax={float(amax):.4f}")
    else:
        parts.append(f"amax=[{float(amax.min()):.4f}, {float(amax.max()):.4f}]({amax.numel()})")
    parts += [f"*{q._scale_amax}"] if q._scale_amax else []
    parts += ["learned"] if q._learn_amax else []
    parts += [f"calibrator={type(q._calibrator).__name__}"] if q._calibrator else []
    parts += [name for name, on in (("quant", q._if_quant), ("clip", q._if_clip),
                                    ("calib", q._if_calib)) if on]
    return " ".join(parts)

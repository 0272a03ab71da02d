"""QuantDescriptor: how one tensor is quantized, checked on construction.

Same constructor, read-only properties, stored forms and exceptions as pytorch-quantization's
``QuantDescriptor`` (``ScaledQuantDescriptor``): ``axis`` is kept exactly as given (``0``
stays ``0``, ``(0,)`` stays a tuple) and ``amax`` as a float32 numpy array.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np
import torch
import yaml

from trtqat.errors import QuantConfigError, QuantTypeError

log = logging.getLogger(__name__)

CALIB_METHODS = ("max", "histogram")  # built in; more: trtqat.quant.calib.registry
E4M3 = (4, 3)

_DEFAULTS: dict[str, Any] = {
    "fake_quant": True, "axis": None, "amax": None, "learn_amax": False, "scale_amax": None,
    "calib_method": "max", "unsigned": False, "narrow_range": False,
}


def axis_tuple(axis: Any) -> tuple[int, ...] | None:
    """``axis`` as a tuple of ints (None per tensor), whichever form it was given in."""
    if axis is None:
        return None
    if isinstance(axis, int) and not isinstance(axis, bool):
        return (axis,)
    if isinstance(axis, (tuple, list)) and all(
        isinstance(a, int) and not isinstance(a, bool) for a in axis
    ):
        if len(set(axis)) != len(axis):
            raise QuantConfigError(f"axis {tuple(axis)} repeats a dimension: list each axis once")
        return tuple(axis) if axis else None
    raise QuantTypeError(f"axis must be None (per tensor), an int or a tuple of ints, got {axis!r}")


def _check_num_bits(num_bits: Any) -> None:
    if isinstance(num_bits, int) and not isinstance(num_bits, bool):
        if num_bits < 0:
            raise QuantConfigError(f"num_bits must be >= 0, got {num_bits}: use 8 for TensorRT INT8")
        if num_bits == 0:
            log.warning("num_bits=0 quantizes every tensor to zeros; use it only to debug")
        return
    if isinstance(num_bits, tuple) and num_bits == E4M3:
        return
    raise QuantTypeError(
        f"num_bits must be a positive int or the tuple (4, 3) for FP8 E4M3, got {num_bits!r}"
    )


def _amax_array(amax: Any) -> np.ndarray | None:
    if amax is None:
        return None
    if isinstance(amax, torch.Tensor):
        amax = amax.detach().cpu().numpy()
    ok = isinstance(amax, (list, tuple, np.ndarray)) or (
        isinstance(amax, numbers.Real) and not isinstance(amax, bool))
    if not ok:
        raise QuantTypeError(f"amax must be float, list or ndarray, got {type(amax).__name__}")
    try:
        return np.array(amax, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise QuantTypeError(f"amax must hold numbers, got {amax!r}") from err


class QuantDescriptor:
    """Describes how a tensor is quantized (pytorch-quantization's API and defaults).

    Args:
        num_bits: integer bits (8 for TensorRT INT8; 0 quantizes to zeros, for debugging), or
            ``(4, 3)`` for FP8 E4M3.
        name: optional name, for reprs only.

    Keyword Args:
        fake_quant: quantize-dequantize (True) or return integers (False).
        axis: None for one range per tensor, or the dimension(s) that keep their own range
            (0 for conv/linear weights). Stored as given.
        amax: optional fixed range (float, list or ndarray; stored as a float32 ndarray).
        learn_amax: learn the range with a :class:`~trtqat.nn.modules.clip.Clip` stage
            (per tensor only, as in pytorch-quantization).
        scale_amax: multiply every amax (fixed, calibrated or dynamic) by this factor.
        calib_method: 'max' or 'histogram' (percentile / mse / entropy are computed from it).
        unsigned: use [0, 2**bits - 1] instead of a signed range.
        narrow_range: signed range [-(2**(b-1)-1), 2**(b-1)-1] instead of the full range.
            Default False (full range [-128, 127] for 8 bits), as in pytorch-quantization:
            ONNX QuantizeLinear and TensorRT's Q layer saturate at -128, so a full-range
            quantizer in PyTorch computes what the engine computes; a narrow one differs from
            the engine wherever an input falls below ``-amax``.

    Raises:
        TypeError (:class:`~trtqat.errors.QuantTypeError`): a wrong type, an unknown keyword,
            ``learn_amax`` with an ``axis``.
        ValueError (:class:`~trtqat.errors.QuantConfigError`): a bad value.
    """

    def __init__(self, num_bits: int | tuple[int, int] = 8, name: str | None = None,
                 **kwargs: Any) -> None:
        _check_num_bits(num_bits)
        if name is not None and not isinstance(name, str):
            raise QuantTypeError(f"name must be a string or None, got {type(name).__name__}")
        unknown = set(kwargs) - set(_DEFAULTS)
        if unknown:
            raise QuantTypeError(f"Unused keys: {sorted(unknown)}; QuantDescriptor takes "
                                 f"{', '.join(_DEFAULTS)}")
        opts = {**_DEFAULTS, **kwargs}
        self._num_bits = num_bits
        self._name = name
        self._fake_quant = bool(opts["fake_quant"])
        self._axis = opts["axis"]
        axis_tuple(self._axis)  # validate only: the stored form is the given one
        self._learn_amax = bool(opts["learn_amax"])
        if self._learn_amax and self._axis is not None:
            raise QuantTypeError("axis is ignored and must be None when learn_amax is True, got "
                                 f"{self._axis!r}: the learned range is per tensor")
        self._amax = _amax_array(opts["amax"])
        self._scale_amax = opts["scale_amax"]
        if self._scale_amax is not None and not self._scale_amax > 0:
            raise QuantConfigError(f"scale_amax must be > 0, got {self._scale_amax!r}")
        self._calib_method = opts["calib_method"]
        if self._calib_method not in CALIB_METHODS:
            from trtqat.quant.calib.registry import calibrator_class

            calibrator_class(self._calib_method)  # a registered calibrator, else one line
        self._unsigned = bool(opts["unsigned"])
        self._narrow_range = bool(opts["narrow_range"])

    # read-only properties, as in pytorch-quantization
    num_bits = property(lambda self: self._num_bits, doc="Integer bits, or (4, 3) for E4M3.")
    name = property(lambda self: self._name, doc="Optional name.")
    fake_quant = property(lambda self: self._fake_quant, doc="Quantize-dequantize if True.")
    axis = property(lambda self: self._axis, doc="Axis kept per channel, as given (None per tensor).")
    amax = property(lambda self: self._amax, doc="Fixed range as a float32 ndarray, or None.")
    learn_amax = property(lambda self: self._learn_amax, doc="Learn the range (Clip stage).")
    scale_amax = property(lambda self: self._scale_amax, doc="Factor applied to every amax.")
    calib_method = property(lambda self: self._calib_method, doc="'max' or 'histogram'.")
    unsigned = property(lambda self: self._unsigned, doc="Unsigned range if True.")
    narrow_range = property(lambda self: self._narrow_range, doc="[-127, 127] instead of [-128, 127].")

    @property
    def max_bound(self) -> int:
        """Largest integer of the range (127 for signed 8-bit, 255 unsigned)."""
        if self._num_bits == E4M3:
            raise QuantConfigError("E4M3 has no integer range (its largest value is 448)")
        return 2 ** (self._num_bits - 1 + int(self._unsigned)) - 1

    @property
    def min_bound(self) -> int:
        """Smallest integer of the range (-128 full signed, -127 narrow, 0 unsigned)."""
        if self._unsigned:
            return 0
        return -self.max_bound if self._narrow_range else -self.max_bound - 1

    def _fields(self) -> dict[str, Any]:
        return {"fake_quant": self._fake_quant, "axis": self._axis,
                "amax": None if self._amax is None else self._amax.tolist(),
                "learn_amax": self._learn_amax, "scale_amax": self._scale_amax,
                "calib_method": self._calib_method, "unsigned": self._unsigned,
                "narrow_range": self._narrow_range}

    def dict(self) -> dict[str, Any]:
        """``num_bits``, ``name`` and every field that differs from its default.

        ``QuantDescriptor(**d.dict()) == d``.
        """
        out: dict[str, Any] = {"num_bits": self._num_bits, "name": self._name}
        out.update({k: v for k, v in self._fields().items() if v != _DEFAULTS[k]})
        return out

    def replace(self, **changes: Any) -> QuantDescriptor:
        """A copy with some fields changed (validated again)."""
        return type(self)(**{**self.dict(), **changes})

    def to_yaml(self) -> str:
        """YAML text of :meth:`dict` (``axis`` and ``num_bits`` tuples as lists)."""
        d = self.dict()
        for key in ("axis", "num_bits"):
            if isinstance(d.get(key), tuple):
                d[key] = list(d[key])
        return yaml.safe_dump(d, width=120)

    @classmethod
    def from_yaml(cls, yaml_str: str) -> QuantDescriptor:
        """The descriptor written by :meth:`to_yaml`."""
        d = yaml.safe_load(yaml_str)
        if not isinstance(d, dict):
            raise QuantTypeError(f"expected a YAML mapping of QuantDescriptor fields, got {d!r}")
        for key in ("axis", "num_bits"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        return cls(**d)

    def _key(self) -> tuple:
        f = self._fields()
        f["amax"] = None if f["amax"] is None else np.asarray(f["amax"]).tobytes()
        f["axis"] = axis_tuple(f["axis"])
        return (self._num_bits, self._name, *f.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantDescriptor) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        parts = [f"num_bits={self._num_bits!r}"]
        if self._name is not None:
            parts.append(f"name={self._name!r}")
        parts += [f"{k}={v!r}" for k, v in self._fields().items() if v != _DEFAULTS[k]]
        return f"QuantDescriptor({', '.join(parts)})"


ScaledQuantDescriptor = QuantDescriptor

QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=(0))
# Deliberate difference: pytorch-quantization's ConvTranspose presets use axis 0, the *input*
# channels of a transposed weight (C_in, C_out/groups, ...). TensorRT's deconvolution takes
# per-channel weight scales along the output channels, axis 1, so that is what we use.
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1,))
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1,))
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1,))

"""QuantDescriptor: how one tensor is quantized, checked on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trtqat.errors import QuantConfigError

CALIB_METHODS = ("max", "histogram")


def _normalize_axis(axis: Any) -> tuple[int, ...] | None:
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
    raise QuantConfigError(
        f"axis must be None (per tensor), an int or a tuple of ints, got {axis!r}"
    )


@dataclass(frozen=True)
class QuantDescriptor:
    """Describes how a tensor is quantized (the pytorch-quantization API, TensorRT defaults).

    Args:
        num_bits: integer bits, 2..16. TensorRT runs 8.
        name: optional name, for reprs only.
        fake_quant: quantize-dequantize (True) or return integers (False).
        axis: None for one range per tensor, or the dimension(s) that keep their own range
            (0 for conv/linear weights, 1 for conv-transpose weights).
        amax: optional initial range (scalar or per-channel list).
        learn_amax: make amax a trainable parameter (straight-through, LSQ-style gradient).
        scale_amax: multiply the calibrated amax by this factor.
        calib_method: 'max' or 'histogram' (percentile / mse / entropy are computed from it).
        unsigned: use [0, 2**bits - 1] instead of a signed range.
        narrow_range: signed range [-(2**(b-1)-1), 2**(b-1)-1], as TensorRT expects.
    """

    num_bits: int = 8
    name: str | None = None
    fake_quant: bool = True
    axis: tuple[int, ...] | None = field(default=None)
    amax: Any = None
    learn_amax: bool = False
    scale_amax: float | None = None
    calib_method: str = "max"
    unsigned: bool = False
    narrow_range: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.num_bits, bool) or not isinstance(self.num_bits, int):
            raise QuantConfigError(f"num_bits must be an int in 2..16, got {self.num_bits!r}")
        if not 2 <= self.num_bits <= 16:
            raise QuantConfigError(
                f"num_bits={self.num_bits} is outside 2..16: use 8 for TensorRT INT8"
            )
        object.__setattr__(self, "axis", _normalize_axis(self.axis))
        if self.calib_method not in CALIB_METHODS:
            raise QuantConfigError(
                f"calib_method={self.calib_method!r} is unknown: use 'max' or 'histogram' "
                "(percentile, mse and entropy are computed from a histogram)"
            )
        if self.scale_amax is not None and not self.scale_amax > 0:
            raise QuantConfigError(f"scale_amax must be > 0, got {self.scale_amax!r}")
        if self.learn_amax and self.axis is not None and self.amax is None:
            # per-channel learned amax gets its shape from calibration; that is fine
            pass

    @property
    def max_bound(self) -> int:
        """Largest integer of the range (127 for signed 8-bit, 255 unsigned)."""
        return 2 ** (self.num_bits - 1 + int(self.unsigned)) - 1

    @property
    def min_bound(self) -> int:
        """Smallest integer of the range (-127 narrow signed, -128 full, 0 unsigned)."""
        if self.unsigned:
            return 0
        return -self.max_bound if self.narrow_range else -self.max_bound - 1

    def dict(self) -> dict[str, Any]:
        """The descriptor as a plain dict (pytorch-quantization compatible)."""
        return asdict(self)

    def replace(self, **changes: Any) -> QuantDescriptor:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


ScaledQuantDescriptor = QuantDescriptor

QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0,))
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0,))
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0,))
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=(0,))
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1,))
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1,))
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1,))

"""The calibrator protocol shared by every calibration method."""

from __future__ import annotations

from typing import ClassVar

import torch

from trtqat.errors import QuantConfigError


def reduce_dims(x: torch.Tensor, axis: tuple[int, ...] | None) -> tuple[int, ...]:
    """Dimensions of ``x`` reduced to get one range per kept ``axis`` (all when None)."""
    if axis is None:
        return tuple(range(x.dim()))
    kept = set()
    for a in axis:
        if not -x.dim() <= a < x.dim():
            raise QuantConfigError(
                f"quantization axis {a} is out of range for a tensor of shape "
                f"{tuple(x.shape)}: use an axis in [{-x.dim()}, {x.dim() - 1}]"
            )
        kept.add(a % x.dim())
    return tuple(d for d in range(x.dim()) if d not in kept)


def follow_bits(calibrator: Calibrator | None, num_bits: int | tuple[int, int]
                ) -> int | tuple[int, int]:
    """``num_bits``, also set on ``calibrator`` (when there is one): its range searches (mse,
    entropy) then score the quantizer's own grid, E4M3's for ``(4, 3)``."""
    if calibrator is not None and hasattr(calibrator, "_num_bits"):
        calibrator._num_bits = num_bits
    return num_bits


class Calibrator:
    """Collects statistics of a tensor and turns them into a range ``amax``.

    ``amax`` has the keep-dim shape of the tensor along ``axis`` (0-d per tensor). Every
    statistic stays on the tensor's device. ``takes_method``: ``compute_amax`` takes an amax
    method name (see :mod:`trtqat.quant.calib.registry`); others always give their own range.
    A new calibrator is a subclass plus ``registry.register_calibrator(kind, cls)``.
    """

    takes_method: ClassVar[bool] = False

    def __init__(self, num_bits: int = 8, axis: tuple[int, ...] | int | None = None,
                 unsigned: bool = False) -> None:
        self._num_bits = num_bits
        self._axis = (axis,) if isinstance(axis, int) else (tuple(axis) if axis else None)
        self._unsigned = unsigned

    def collect(self, x: torch.Tensor) -> None:
        """Add the statistics of one batch."""
        raise NotImplementedError

    def compute_amax(self, *args, **kwargs) -> torch.Tensor | None:
        """The range from everything collected (None when nothing was collected)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget everything collected."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_bits={self._num_bits}, axis={self._axis}, unsigned={self._unsigned})"

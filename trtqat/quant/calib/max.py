"""Max calibration: the largest absolute value seen, per tensor or per channel."""

from __future__ import annotations

import torch

from trtqat.errors import CalibrationError
from trtqat.quant.calib.base import Calibrator, reduce_dims


class MaxCalibrator(Calibrator):
    """Running maximum of ``|x|`` (one value, or one per channel along ``axis``).

    Args:
        num_bits, axis, unsigned: as in the QuantDescriptor of the quantizer.
        track_amax: also keep every batch's amax in ``amaxs`` (for inspection).
    """

    def __init__(self, num_bits: int = 8, axis=None, unsigned: bool = False,
                 track_amax: bool = False) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._track_amax = track_amax
        self._calib_amax: torch.Tensor | None = None
        self.amaxs: list[torch.Tensor] = []

    def collect(self, x: torch.Tensor) -> None:
        """Update the running maximum with one batch."""
        x = x.detach()
        dims = reduce_dims(x, self._axis)
        if x.numel() == 0:
            return
        amax = x.abs().amax(dim=dims, keepdim=True) if dims else x.abs()
        if self._axis is None:
            amax = amax.reshape(())
        amax = amax.float()
        if self._track_amax:
            self.amaxs.append(amax.clone())
        if self._calib_amax is None:
            self._calib_amax = amax
        elif self._calib_amax.shape != amax.shape:
            raise CalibrationError(
                f"amax shape changed: MaxCalibrator got a batch whose per-channel shape "
                f"{tuple(amax.shape)} differs from earlier batches {tuple(self._calib_amax.shape)}: keep the quantization "
                "axis sizes fixed, or reset()"
            )
        else:
            torch.maximum(self._calib_amax, amax, out=self._calib_amax)

    def compute_amax(self) -> torch.Tensor | None:
        """The maximum over all collected batches."""
        return self._calib_amax

    def reset(self) -> None:
        """Forget every batch."""
        self._calib_amax = None
        self.amaxs = []

"""Histogram calibration (placeholder being replaced)."""

from __future__ import annotations

import torch

from trtqat.quant.calib.base import Calibrator


class HistogramCalibrator(Calibrator):
    def __init__(self, num_bits: int = 8, axis=None, unsigned: bool = False, num_bins: int = 2048,
                 grow_method=None, skip_zeros: bool = False, torch_hist: bool = True) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._num_bins = num_bins
        self.reset()

    def collect(self, x: torch.Tensor) -> None:
        x = x.detach().abs().float()
        m = x.max()
        if self._max is None:
            self._max = m
            self._hist = torch.histc(x, self._num_bins, 0, float(m))
        else:
            raise NotImplementedError

    def compute_amax(self, method: str = "max", **kwargs):
        return self._max

    def reset(self) -> None:
        self._max = None
        self._hist = None

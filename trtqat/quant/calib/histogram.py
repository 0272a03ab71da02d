"""Histogram calibration: percentile, MSE and entropy (KL divergence) ranges.

One histogram of ``|x|`` per tensor, or one per channel along ``axis``, each over
``[0, running max]`` with a fixed number of bins. Everything is vectorised with torch on the
tensor's own device: per-channel histograms come from a single ``bincount`` with per-channel
offsets, and the candidate thresholds of MSE and entropy are scored all at once.

Range growth: when a batch exceeds the current range, the counts collected so far are
re-binned onto the wider range ``[0, new max]`` assuming the values inside each old bin are
spread uniformly over it (an old bin straddling a new edge splits its count in proportion to
the overlap), and the new batch is histogrammed exactly on the new range. After one growth
step the cumulative count at any new edge is off by at most the count of the one old bin
straddling that edge (counts are no longer integers). Nothing is approximated while the range
does not grow, and the exact maximum is kept separately (method ``'max'``).

Differences from pytorch-quantization (whose entropy method is otherwise reproduced):
'percentile' returns the edge *after* the bin where the cumulative count reaches the
percentile (pytorch-quantization returns the edge before it); 'mse' tries bin edges
``start_bin..num_bins`` (pytorch-quantization tries bin centres ``start_bin..num_bins-1``);
entropy scores a candidate whose ``q`` is undefined as ``+inf`` rather than NaN
(pytorch-quantization's argmin could then pick it); per-channel histograms are supported.
"""

from __future__ import annotations

import logging
import math

import torch

from trtqat.errors import CalibrationError, QuantConfigError
from trtqat.quant.calib.base import Calibrator, reduce_dims
from trtqat.quant.calib.fp8_mse import is_fp8
from trtqat.quant.calib.registry import amax_from_histogram, get_method, methods
from trtqat.quant.calib.thresholds import rebin_histogram

log = logging.getLogger(__name__)

__all__ = ["HistogramCalibrator", "amax_from_histogram", "rebin_histogram", "METHODS"]

METHODS = methods()  # the built-in methods; trtqat.quant.calib.registry.methods() has all

# torch.histc counts in the input dtype (float32): larger batches are histogrammed in chunks
_HISTC_CHUNK = 1 << 24


class HistogramCalibrator(Calibrator):
    """Histogram of ``|x|`` (per tensor, or per channel along ``axis``) for range calibration.

    Args:
        num_bits, axis, unsigned: as in the QuantDescriptor of the quantizer.
        num_bins: bins per histogram; the range ``[0, running max]`` is split evenly.
        grow_method: deprecated and ignored, as in pytorch-quantization: the counts are always
            re-binned onto ``[0, new max]`` (see the module docstring).
        skip_zeros: leave exact zeros out of the histogram (they still count for 'max').
        torch_hist: accepted for pytorch-quantization compatibility; histograms are always
            computed with torch on the tensor's device.

    ``compute_amax(method)``: 'percentile', 'mse', 'entropy' or 'max' (the exact largest
    ``|x|``). amax is float32 with the keep-dim shape of the tensor along ``axis`` (0-d per
    tensor); None before any data. Each ``collect`` reads a few scalars back to the host (the
    batch maximum, whether the range grew), i.e. synchronises with the device.
    """

    takes_method = True

    def __init__(self, num_bits: int = 8, axis=None, unsigned: bool = False,
                 num_bins: int = 2048, grow_method: str | None = None, skip_zeros: bool = False,
                 torch_hist: bool = True) -> None:
        if not is_fp8(num_bits) and (isinstance(num_bits, bool) or not isinstance(num_bits, int)
                                     or not 2 <= num_bits <= 16):
            raise QuantConfigError(f"num_bits must be an int in 2..16 or (4, 3) for FP8 E4M3, "
                                   f"got {num_bits!r}")
        if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2:
            raise QuantConfigError(
                f"num_bins must be an int >= 2, got {num_bins!r}: use num_bins=2048")
        if grow_method not in (None, "stretch"):
            log.warning("grow_method=%r is deprecated and ignored (as in pytorch-quantization): "
                        "counts are always re-binned onto the wider range", grow_method)
        super().__init__(num_bits, axis, unsigned)
        self._num_bins = num_bins
        self._grow_method = grow_method
        self._skip_zeros = bool(skip_zeros)
        self._torch_hist = torch_hist
        self._offsets: torch.Tensor | None = None
        self.reset()

    # ----------------------------------------------------------------- state
    @property
    def num_bins(self) -> int:
        """Bins per histogram."""
        return self._num_bins

    @property
    def hist(self) -> torch.Tensor | None:
        """Counts (float64): ``(num_bins,)`` per tensor, else ``amax_shape + (num_bins,)``."""
        if self._hist is None:
            return None
        if self._axis is None:
            return self._hist.reshape(-1)
        return self._hist.reshape(*self._max.shape, self._num_bins)

    @property
    def bin_edges(self) -> torch.Tensor | None:
        """Bin edges (float32), shaped like :attr:`hist` with one more entry in the last dim."""
        if self._hist is None:
            return None
        steps = torch.arange(self._num_bins + 1, device=self._max.device, dtype=torch.float64)
        rng = self._max.to(torch.float64).unsqueeze(-1)
        edges = (steps * (rng / self._num_bins)).float()
        edges[..., -1] = self._max
        return edges

    # pytorch-quantization's attribute names (plotting code reads them): the same tensors
    _calib_hist = property(lambda self: self.hist, doc="pytorch-quantization's name of hist.")
    _calib_bin_edges = property(lambda self: self.bin_edges,
                                doc="pytorch-quantization's name of bin_edges.")

    def reset(self) -> None:
        """Forget every batch."""
        self._hist: torch.Tensor | None = None  # (C, num_bins) float64
        self._max: torch.Tensor | None = None  # keep-dim float32 running max == range
        # the part of _hist already merged across ranks (kept on the same bins as _hist)
        self._shared: torch.Tensor | None = None

    def _set_state(self, hist: torch.Tensor | None, amax: torch.Tensor | None,
                   shared: bool = False) -> None:
        """Replace the statistics (used to merge calibrators, e.g. across ranks).

        ``shared``: the statistics are now identical on every rank; a later merge then only
        adds what each rank collects from here on (see ``distributed.sync_calibrators``).
        """
        if (hist is None) != (amax is None):
            raise ValueError("hist and amax must both be given or both be None")
        if hist is not None:
            hist = hist.reshape(-1, self._num_bins).to(torch.float64)
            amax = amax.float()
            if hist.shape[0] != amax.numel():
                raise ValueError(f"hist has {hist.shape[0]} rows for {amax.numel()} ranges")
        self._hist, self._max = hist, amax
        self._shared = hist.clone() if (shared and hist is not None) else None

    def _grow(self, old_range: torch.Tensor, new_range: torch.Tensor) -> None:
        """Re-bin the collected counts from ``[0, old_range]`` onto ``[0, new_range]``."""
        self._hist = rebin_histogram(self._hist, old_range, new_range)
        if self._shared is not None:
            self._shared = rebin_histogram(self._shared, old_range, new_range)

    # ----------------------------------------------------------------- collection
    def collect(self, x: torch.Tensor) -> None:
        """Add one batch to the histogram(s), growing the range if the batch exceeds it."""
        x = x.detach()
        dims = reduce_dims(x, self._axis)
        if x.numel() == 0:
            return
        a = x.abs()
        if a.dtype != torch.float32:
            a = a.float()
        if self._axis is None:
            self._collect_per_tensor(a)
        else:
            self._collect_per_channel(a, dims)

    def _collect_per_tensor(self, a: torch.Tensor) -> None:
        n = self._num_bins
        batch_max = a.max()
        bmax = float(batch_max)
        if not math.isfinite(bmax):
            raise CalibrationError(_NONFINITE)
        old = None if self._max is None else float(self._max)
        rng = bmax if old is None else max(old, bmax)
        if rng > 0 and a.numel() <= _HISTC_CHUNK:
            h = torch.histc(a, n, 0.0, rng).to(torch.float64)
        elif rng > 0:  # histc counts in float32: exact only up to 2**24 per call
            h = sum(torch.histc(c, n, 0.0, rng).to(torch.float64)
                    for c in a.reshape(-1).split(_HISTC_CHUNK))
        else:
            h = torch.zeros(n, device=a.device, dtype=torch.float64)
            h[0] = a.numel()
        if self._skip_zeros:
            h[0] -= (a == 0).sum()
        h = h.unsqueeze(0)
        if self._hist is None:
            self._hist = h
            self._max = batch_max.to(torch.float32).reshape(()).clone()
            return
        h = h.to(self._hist.device)
        if rng > old:
            self._grow(self._max.reshape(1).to(self._hist.device),
                       torch.full((1,), rng, dtype=torch.float64, device=self._hist.device))
            self._max = batch_max.to(device=self._max.device, dtype=torch.float32).reshape(())
        self._hist += h

    def _channel_offsets(self, shape: torch.Size, device, dtype) -> torch.Tensor:
        off = self._offsets
        if off is None or off.shape != shape or off.device != device or off.dtype != dtype:
            numel = math.prod(shape)
            off = (torch.arange(numel, device=device, dtype=dtype) * self._num_bins).view(shape)
            self._offsets = off
        return off

    def _collect_per_channel(self, a: torch.Tensor, dims: tuple[int, ...]) -> None:
        n = self._num_bins
        batch_max = a.amax(dim=dims, keepdim=True) if dims else a.clone()
        if self._max is not None and batch_max.shape != self._max.shape:
            raise CalibrationError(
                f"amax shape changed: HistogramCalibrator got a batch whose per-channel shape "
                f"{tuple(batch_max.shape)} differs from earlier batches "
                f"{tuple(self._max.shape)}: keep the quantization axis sizes fixed, or reset()")
        if not bool(torch.isfinite(batch_max).all()):
            raise CalibrationError(_NONFINITE)
        old = None if self._max is None else self._max.to(a.device)
        rng = batch_max if old is None else torch.maximum(old, batch_max)
        channels = rng.numel()
        zeros = (a == 0).sum(dim=dims) if (self._skip_zeros and dims) else None
        if self._skip_zeros and not dims:
            zeros = (a == 0)
        # bin index = floor(|x| * N / range) + channel * N, all channels in one bincount
        scale = torch.where(rng > 0, n / torch.where(rng > 0, rng, 1.0), 0.0)
        idx_dtype = torch.int32 if channels * n < 2**31 else torch.int64
        idx = a.mul_(scale).to(idx_dtype).clamp_(max=n - 1)
        idx.add_(self._channel_offsets(rng.shape, a.device, idx_dtype))
        h = torch.bincount(idx.reshape(-1), minlength=channels * n).view(channels, n)
        h = h.to(torch.float64)
        if zeros is not None:
            h[:, 0] -= zeros.reshape(-1).to(torch.float64)
        if self._hist is None:
            self._hist = h
            self._max = rng.to(torch.float32)
            return
        h = h.to(self._hist.device)
        if bool((batch_max > old).any()):
            self._grow(old.reshape(-1).to(self._hist.device),
                       rng.reshape(-1).to(self._hist.device))
        self._max = rng.to(device=self._max.device, dtype=torch.float32)
        self._hist += h

    # ----------------------------------------------------------------- amax
    def compute_amax(self, method: str = "max", *, stride: int = 1, start_bin: int = 128,
                     percentile: float = 99.99, **options) -> torch.Tensor | None:
        """The range from the histogram(s); None when nothing was collected.

        Args:
            method: 'percentile' (smallest bin edge whose cumulative count reaches
                ``percentile`` % of the total), 'mse' (bin edge minimising the count-weighted
                squared fake-quantization error of the bin centres), 'entropy' (TensorRT's
                KL-divergence threshold), 'max' (exact largest ``|x|``) or any method
                registered in :mod:`trtqat.quant.calib.registry`.
            stride, start_bin: candidate edges ``start_bin, start_bin + stride, ...`` up to
                ``num_bins`` for 'mse' and 'entropy'.
            percentile: in (0, 100], for 'percentile'.
            options: the options of other registered methods.
        """
        options.update(stride=stride, start_bin=start_bin, percentile=percentile)
        spec = get_method(method)
        own = spec.resolve(self._num_bins, self._num_bits, self._unsigned, options)
        if self._hist is None:
            return None
        if not spec.needs_histogram:
            return self._max.clone()
        return amax_from_histogram(self._hist, self._max.to(self._hist.device), method,
                                   num_bits=self._num_bits, unsigned=self._unsigned, **own
                                   ).to(self._max.device)

    def __repr__(self) -> str:
        return (f"HistogramCalibrator(num_bits={self._num_bits}, axis={self._axis}, "
                f"unsigned={self._unsigned}, num_bins={self._num_bins}, "
                f"skip_zeros={self._skip_zeros})")


_NONFINITE = ("HistogramCalibrator got NaN or inf values; calibrate on finite data (check the "
              "inputs and the layers before this quantizer)")

"""Thresholds from histograms: where percentile, MSE and entropy put the range.

Each search takes histograms ``hist`` (``(C, N)`` float64 counts, bins over ``[0, range]``)
and returns, per row, the bin edge ``k`` (``0..N``) of the chosen range; the range itself is
``k * range / N``. Candidate thresholds are scored all at once (chunked to bound memory).
:func:`rebin_histogram` moves counts onto a wider range when a calibrator's range grows.
The methods are registered by name in :mod:`trtqat.quant.calib.registry`; the ``check_*``
functions validate their options with one-line errors.
"""

from __future__ import annotations

import math
from numbers import Real

import torch

from trtqat.errors import CalibrationError, CalibrationValueError

# Elements per temporary tensor when scoring candidate thresholds (MSE and entropy); larger
# problems are processed in chunks of channels / candidates.
_CHUNK_ELEMENTS = 1 << 22
# Divergences within this of the minimum count as ties; ties go to the largest threshold
# (pytorch-quantization takes the last argmin).
_KL_TIE_TOL = 1e-10


def rebin_histogram(hist: torch.Tensor, old_range: torch.Tensor,
                    new_range: torch.Tensor) -> torch.Tensor:
    """Move counts of ``hist`` (``(C, N)``, bins over ``[0, old_range]``) onto ``[0, new_range]``.

    ``new_range >= old_range`` per channel (``(C,)`` each). Each old bin's count is split
    between the (at most two) new bins it overlaps, in proportion to the overlap, i.e. values
    are assumed uniform inside a bin. Channels whose range does not change are copied exactly.
    """
    num_bins = hist.shape[-1]
    old = old_range.reshape(-1, 1).to(torch.float64)
    new = new_range.reshape(-1, 1).to(torch.float64)
    # width of an old bin in units of new bins (0 when the old range was 0: all mass at 0)
    s = torch.where(new > 0, old / torch.where(new > 0, new, 1.0), 1.0).clamp(0.0, 1.0)
    j = torch.arange(num_bins, device=hist.device, dtype=torch.float64)
    lo = j * s  # (C, N) left edge of each old bin, in new-bin units
    k = torch.floor(lo)
    frac = ((k + 1.0 - lo) / s.clamp_min(1e-300)).clamp(0.0, 1.0)
    k = k.to(torch.int64).clamp_(max=num_bins - 1).expand_as(hist)
    left = hist * frac
    right = hist - left
    out = torch.zeros_like(hist)
    out.scatter_add_(1, k, left)
    out.scatter_add_(1, (k + 1).clamp_(max=num_bins - 1), right)
    return out


def _percentile_bins(hist: torch.Tensor, percentile: float) -> torch.Tensor:
    """Per row, the smallest edge index ``k`` with ``sum(hist[:k]) >= percentile% of total``."""
    zero = torch.zeros_like(hist[:, :1])
    cum = torch.cat([zero, hist.cumsum(1)], 1).contiguous()
    thr = (percentile / 100.0) * cum[:, -1:]
    return torch.searchsorted(cum, thr.contiguous()).reshape(-1)


def _candidates(num_bins: int, start_bin: int, stride: int, device) -> torch.Tensor:
    return torch.arange(start_bin, num_bins + 1, stride, device=device, dtype=torch.int64)


def _mse_bins(hist: torch.Tensor, qmax: int, start_bin: int, stride: int) -> torch.Tensor:
    """Per row, the candidate edge minimising the count-weighted fake-quant error of bin centres.

    Candidates are edges ``start_bin, start_bin + stride, ..., <= num_bins``; the error is
    computed in units of a bin width (the argmin does not depend on it). Ties: first.
    """
    num_bins = hist.shape[1]
    cand = _candidates(num_bins, start_bin, stride, hist.device)
    centers = torch.arange(num_bins, device=hist.device, dtype=torch.float64) + 0.5
    per_chunk = max(1, _CHUNK_ELEMENTS // num_bins)
    errs = []
    for c0 in range(0, cand.numel(), per_chunk):
        a = cand[c0:c0 + per_chunk].to(torch.float64).unsqueeze(1)  # (k, 1) amax in bins
        err = centers * (qmax / a)  # (k, N): centre in quantization steps
        err.round_().clamp_(max=qmax).mul_(a / qmax).sub_(centers).square_()
        errs.append(hist @ err.T)  # (C, k)
    mse = torch.cat(errs, 1)
    return cand[mse.argmin(1)]


def _entropy_bins(hist: torch.Tensor, num_levels: int, start_bin: int,
                  stride: int) -> torch.Tensor:
    """Per row, TensorRT's KL-divergence threshold (as pytorch-quantization's entropy method).

    For each candidate ``i``: ``p = hist[:i]`` with the outlier mass ``sum(hist[i:])`` added to
    its last bin; ``q`` merges ``hist[:i]`` into ``num_levels`` levels (bin ``j`` -> level
    ``floor(j * num_levels / i)``) and spreads each level's count evenly over its nonzero bins.
    ``KL(p || q)`` is computed from prefix sums (O(levels) per candidate, no per-candidate loop).
    The first bin is replaced by the second beforehand (as pytorch-quantization does, so a spike
    of zeros does not dominate). ``num_levels`` is ``2**(num_bits - 1 + unsigned)`` (128 for
    signed 8-bit), as in pytorch-quantization and TensorRT's entropy calibrator. Candidates
    where ``q`` cannot represent ``p`` score ``inf``; ties within ``1e-10`` go to the largest
    candidate.
    """
    xlogy = torch.special.xlogy
    n_rows, num_bins = hist.shape
    dev = hist.device
    h = hist.clone()
    h[:, 0] = h[:, 1]
    cand = _candidates(num_bins, start_bin, stride, dev)  # (K,)
    n_cand = cand.numel()
    lev = torch.arange(num_levels + 1, device=dev, dtype=torch.int64)
    # first bin of each level: ceil(l * i / L); bounds[:, L] == i
    bounds = (lev.unsqueeze(0) * cand.unsqueeze(1) + num_levels - 1) // num_levels  # (K, L+1)
    lo_flat = bounds[:, :-1].reshape(-1)
    hi_flat = bounds[:, 1:].reshape(-1)
    last_level = ((cand - 1) * num_levels) // cand  # (K,) level holding bin i-1
    last_lo = bounds[torch.arange(n_cand, device=dev), last_level]
    last_hi = bounds[torch.arange(n_cand, device=dev), last_level + 1]

    zero = torch.zeros_like(h[:, :1])
    cum = torch.cat([zero, h.cumsum(1)], 1)  # (C, N+1) sum of h[:k]
    cnz = torch.cat([zero, (h > 0).to(h.dtype).cumsum(1)], 1)  # nonzero bins in h[:k]
    chl = torch.cat([zero, xlogy(h, h).cumsum(1)], 1)  # sum of h log h over h[:k]

    rows_per_chunk = max(1, _CHUNK_ELEMENTS // (n_cand * num_levels))
    best = []
    for r0 in range(0, n_rows, rows_per_chunk):
        sl = slice(r0, r0 + rows_per_chunk)
        c_cum, c_cnz, c_chl, c_h = cum[sl], cnz[sl], chl[sl], h[sl]
        rows = c_h.shape[0]
        total = c_cum[:, -1:]  # (r, 1)
        safe_total = torch.where(total > 0, total, 1.0)
        s = c_cum[:, cand]  # (r, K) mass inside the candidate range
        outl = total - s
        h_last = c_h[:, cand - 1]
        # T * sum p log p  (p = h / T, last bin h + outliers)
        ent_p = (c_chl[:, cand - 1] - c_cum[:, cand - 1] * torch.log(safe_total)
                 + xlogy(h_last + outl, (h_last + outl) / safe_total))
        # T * sum p log q, with q = (level sum / level nonzero bins) / s on nonzero bins:
        # sum_l L log L - sum_l L log n - s log s, plus the outliers in the last bin
        lvl = c_cum.index_select(1, hi_flat) - c_cum.index_select(1, lo_flat)  # (r, K*L)
        nz = c_cnz.index_select(1, hi_flat) - c_cnz.index_select(1, lo_flat)
        lvl_term = (xlogy(lvl, lvl) - xlogy(lvl, nz)).view(rows, n_cand, num_levels).sum(-1)
        q_last = ((c_cum[:, last_hi] - c_cum[:, last_lo])
                  / ((c_cnz[:, last_hi] - c_cnz[:, last_lo]).clamp_min(1.0) * s))
        cross = lvl_term - xlogy(s, s) + xlogy(outl, q_last)
        kl = (ent_p - cross) / safe_total
        kl = torch.where((s <= 0) | ((outl > 0) & (h_last <= 0)), math.inf, kl)
        kl = torch.where(total > 0, kl, 0.0)
        min_kl = kl.min(1, keepdim=True).values
        tie = kl <= min_kl + _KL_TIE_TOL
        pos = torch.arange(n_cand, device=dev).expand(rows, -1)
        best.append(cand[torch.where(tie, pos, -1).amax(1)])
    return torch.cat(best)


def percentile_bins(hist: torch.Tensor, *, num_bits: int, unsigned: bool,
                    percentile: float) -> torch.Tensor:
    """'percentile': the edge after the bin where the count reaches ``percentile`` %."""
    return _percentile_bins(hist, float(percentile))


def mse_bins(hist: torch.Tensor, *, num_bits: int, unsigned: bool, start_bin: int,
             stride: int) -> torch.Tensor:
    """'mse': the candidate edge with the least count-weighted fake-quantization error (of
    the FP8 E4M3 grid for ``num_bits=(4, 3)``: :mod:`trtqat.quant.calib.fp8_mse`)."""
    from trtqat.quant.calib.fp8_mse import fp8_mse_bins, is_fp8

    if is_fp8(num_bits):
        return fp8_mse_bins(hist, start_bin, stride)
    return _mse_bins(hist, 2 ** (num_bits - 1 + int(unsigned)) - 1, start_bin, stride)


def entropy_bins(hist: torch.Tensor, *, num_bits: int, unsigned: bool, start_bin: int,
                 stride: int) -> torch.Tensor:
    """'entropy': TensorRT's KL-divergence threshold."""
    return _entropy_bins(hist, 1 << (num_bits - 1 + int(unsigned)), start_bin, stride)


def check_percentile(num_bins: int, num_bits: int, unsigned: bool, *, percentile) -> None:
    """``percentile`` in (0, 100]."""
    if isinstance(percentile, bool) or not isinstance(percentile, Real) or not 0 < percentile <= 100:
        raise CalibrationValueError(
            f"percentile={percentile!r} is out of range (0, 100]: use e.g. percentile=99.99")


def check_candidates(num_bins: int, num_bits: int, unsigned: bool, *, start_bin,
                     stride) -> None:
    """``stride >= 1`` and ``start_bin`` in ``1..num_bins`` (MSE and entropy)."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise CalibrationError(f"stride={stride!r} must be an int >= 1: use stride=1")
    if isinstance(start_bin, bool) or not isinstance(start_bin, int) or not (
            1 <= start_bin <= num_bins):
        raise CalibrationError(
            f"start_bin={start_bin!r} must be an int in 1..num_bins ({num_bins}): "
            "lower start_bin or collect with more bins")


def check_entropy(num_bins: int, num_bits: int, unsigned: bool, *, start_bin, stride) -> None:
    """The candidates, and at least one bin per quantization level; FP8 has no levels."""
    from trtqat.quant.calib.fp8_mse import refuse_entropy

    refuse_entropy(num_bits)
    check_candidates(num_bins, num_bits, unsigned, start_bin=start_bin, stride=stride)
    levels = 1 << (num_bits - 1 + int(unsigned))
    if num_bins < levels:
        raise CalibrationError(
            f"entropy calibration of {num_bits}-bit {'unsigned' if unsigned else 'signed'} "
            f"values needs num_bins >= {levels}, got {num_bins}: use "
            f"HistogramCalibrator(num_bins={max(2048, levels)}) or another method")

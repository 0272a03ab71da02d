"""Merge calibration statistics across torch.distributed ranks.

After :func:`sync_calibrators` every rank holds the same statistics, so every rank computes
the same amax. Three collectives in all, whatever the number of calibrators: one ``MAX`` of a
small integer table (which calibrators have data, and their shapes), one ``MAX`` of every
running maximum (max calibrators' amax and histogram ranges, concatenated), and one ``SUM`` of
every histogram, re-binned first onto the shared range.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from trtqat.errors import CalibrationError
from trtqat.quant.calib.histogram import HistogramCalibrator
from trtqat.quant.calib.max import MaxCalibrator
from trtqat.quant.calib.thresholds import rebin_histogram

log = logging.getLogger(__name__)

__all__ = ["sync_calibrators"]

_MAX_DIMS = 8  # dimensions of an amax shape that the metadata table can describe
_ABSENT = -(2**62)  # "no data on this rank" in the negated columns (loses every MAX)


def _comm_device(group) -> torch.device:
    """Device whose tensors the group's backend can reduce."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local_state(cal) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(amax or histogram range, histogram or None) of one calibrator, None when empty."""
    if isinstance(cal, MaxCalibrator):
        return cal._calib_amax, None
    return cal._max, cal._hist


def _meta_row(cal) -> list[int]:
    """Columns: kind, -kind, num_bins, -num_bins, has, bad, shape info, negated shape info."""
    kind = 1 if isinstance(cal, MaxCalibrator) else 2
    bins = cal.num_bins if isinstance(cal, HistogramCalibrator) else 0
    amax, _ = _local_state(cal)
    shape_cols = [0] * (1 + _MAX_DIMS)
    has, bad = 0, 0
    if amax is not None:
        has = 1
        if amax.dim() > _MAX_DIMS:
            bad = 1
        else:
            shape_cols = [amax.dim(), *amax.shape, *([0] * (_MAX_DIMS - amax.dim()))]
    neg = [-v for v in shape_cols] if has else [_ABSENT] * len(shape_cols)
    return [kind, -kind, bins, -bins, has, bad, *shape_cols, *neg]


def sync_calibrators(calibrators: Iterable, group=None) -> None:
    """Merge the statistics of ``calibrators`` across the ranks of ``group`` (in place).

    Every rank must pass the same calibrators in the same order (e.g. those of the same
    model). Max calibrators take the elementwise maximum; histogram calibrators agree on the
    largest range, re-bin their counts onto it (see ``trtqat.quant.calib.histogram``) and sum
    them. A calibrator that collected nothing on some ranks takes the others' statistics; one
    that collected nothing anywhere stays empty. Other calibrator types are left alone.
    Calling it again after more batches adds only the new counts (what an earlier call merged
    is not counted twice).
    A no-op when torch.distributed is not initialised or the group has one rank.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size(group) <= 1:
        return
    cals = []
    for cal in calibrators:
        if isinstance(cal, (MaxCalibrator, HistogramCalibrator)):
            cals.append(cal)
        else:
            log.warning("sync_calibrators: leaving %s unsynchronised (unknown kind)",
                        type(cal).__name__)
    if not cals:
        return
    comm = _comm_device(group)
    rank = dist.get_rank(group)
    home = next((a.device for a in (_local_state(c)[0] for c in cals) if a is not None), comm)

    # 1. which calibrators have data where, and their shapes (one MAX of an int64 table)
    meta = torch.tensor([_meta_row(c) for c in cals], dtype=torch.int64, device=comm)
    dist.all_reduce(meta, op=dist.ReduceOp.MAX, group=group)
    meta = meta.cpu().tolist()
    shapes: list[tuple[int, ...] | None] = []
    width = 1 + _MAX_DIMS
    for pos, (cal, row) in enumerate(zip(cals, meta)):
        kind, neg_kind, bins, neg_bins, has, bad = row[:6]
        hi, lo = row[6:6 + width], [-v for v in row[6 + width:]]
        if kind != -neg_kind or bins != -neg_bins:
            raise CalibrationError(
                f"sync_calibrators: calibrator {pos} differs between ranks (kind or num_bins); "
                "pass the same calibrators, in the same order, on every rank")
        if bad:
            raise CalibrationError(
                f"sync_calibrators: calibrator {pos} has an amax of more than {_MAX_DIMS} "
                "dimensions, which cannot be synchronised; quantize along fewer dimensions")
        if not has:
            shapes.append(None)
            continue
        if hi != lo:
            raise CalibrationError(
                f"sync_calibrators: calibrator {pos} ({cal!r}) has amax shape "
                f"{tuple(lo[1:1 + lo[0]])} on some rank and {tuple(hi[1:1 + hi[0]])} on "
                "another; calibrate the same model on every rank")
        shapes.append(tuple(hi[1:1 + hi[0]]))

    present = [(c, s) for c, s in zip(cals, shapes) if s is not None]
    if not present:
        return

    # 2. running maxima and histogram ranges (one MAX; zeros where a rank has no data)
    parts = []
    for cal, shape in present:
        amax, _ = _local_state(cal)
        parts.append(amax.detach().reshape(-1).to(comm, torch.float32) if amax is not None
                     else torch.zeros(math.prod(shape), device=comm, dtype=torch.float32))
    maxima = torch.cat(parts)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
    merged_max = dict(zip((id(c) for c, _ in present),
                          maxima.split([math.prod(s) for _, s in present])))

    # 3. histograms re-binned onto the shared range, then summed (one SUM in float64)
    hists = [(c, s) for c, s in present if isinstance(c, HistogramCalibrator)]
    merged_hist = {}
    if hists:
        parts = []
        for cal, _ in hists:
            rng, hist = _local_state(cal)
            new_rng = merged_max[id(cal)]
            if hist is None:
                parts.append(torch.zeros(new_rng.numel() * cal.num_bins, device=comm,
                                         dtype=torch.float64))
                continue
            hist = hist.to(comm, torch.float64)
            if cal._shared is not None and rank != 0:
                # counts merged by an earlier sync are already on every rank: send them once
                hist = (hist - cal._shared.to(comm)).clamp_(min=0)
            old_rng = rng.reshape(-1).to(comm)
            if bool((new_rng > old_rng).any()):
                hist = rebin_histogram(hist, old_rng, new_rng)
            parts.append(hist.reshape(-1))
        counts = torch.cat(parts)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
        sizes = [math.prod(s) * c.num_bins for c, s in hists]
        merged_hist = dict(zip((id(c) for c, _ in hists), counts.split(sizes)))

    for cal, shape in present:
        amax, _ = _local_state(cal)
        device = amax.device if amax is not None else home
        new_max = merged_max[id(cal)].reshape(shape).to(device).clone()
        if isinstance(cal, MaxCalibrator):
            cal._calib_amax = new_max
        else:
            hist = merged_hist[id(cal)].reshape(-1, cal.num_bins).to(device).clone()
            cal._set_state(hist, new_max, shared=True)

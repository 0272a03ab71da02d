"""The export criterion: real export bugs fail, accumulated rounding noise is only reported.

An INT8 file computes the same integer codes as the PyTorch fake-quant model except where a
value sits within float error of a rounding tie: a different summation order then rounds it
the other way, and over 20 layers such flips accumulate (more in deep or untrained models).
What that noise amounts to is measured once per export, the **noise floor**: the PyTorch
fake-quant model run in float64 against the same model in float32, on the same inputs. The
two differ only in their rounding order, exactly as ONNX Runtime and PyTorch do.

Hard failures (real export bugs):

- a non-finite output (NaN or inf), from ONNX Runtime or from PyTorch;
- the wrong graph or wrong scales (:mod:`trtqat.export.qdq_check`): an active quantizer
  without its Q/DQ, or a Q/DQ whose scale is not ``amax / maxbound``;
- top-1 disagreement beyond what rounding explains: ``k`` disagreements among ``n`` samples
  fail only when ``k`` exceeds the binomial bound of an allowed rate (0.5%, the 99.5%
  agreement target, or twice the noise floor's flip rate if that is higher) at a one in
  1000 false-alarm level. One or two flips on a small sample cannot fail a good export,
  and a broken one fails however the data is batched. A disagreement on a sample whose
  reference top-1 margin is within twice the largest float64-vs-float32 difference is a
  rounding tie and is not counted (deep untrained models drift that far by themselves);
- a mean output difference far beyond the noise floor (8x, and at least one step).

Reported, not failing: the share of outputs within one step and the largest difference.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trtqat.outputs import leaves
from trtqat.variants import TABLE

TOP1_MIN = 0.995  # agreement target: 0.5% disagreement is allowed
FALSE_ALARM = 1e-3  # chance that a correct export fails the top-1 test
FLOOR_MARGIN = 2.0  # two float32 orders each differ from float64: up to twice the flips
# mean |ORT - PyTorch| in steps: at most margin x noise floor, and never below the minimum
# (the variants table's ``mean_limit``; int8-fp16 re-rounds every activation in fp16).
MEAN_LIMIT = {v.name: v.mean_limit for v in TABLE if v.mean_limit is not None}


@dataclass(frozen=True)
class NoiseFloor:
    """Float64 vs float32 PyTorch, one output: mean difference (in that output's steps) and
    top-1 flips among the samples the agreement is counted on."""

    mean_abs: float
    flips: int
    samples: int
    max_abs: float = 0.0  # the largest float64-vs-float32 difference of one output value

    @property
    def rate(self) -> float:
        return self.flips / self.samples if self.samples else 0.0


def binom_upper(n: int, rate: float, alpha: float = FALSE_ALARM) -> int:
    """The largest count ``k`` with ``P(X >= k) >= alpha`` for ``X ~ Binomial(n, rate)``:
    more than ``k`` events are implausible (below ``alpha``) at that rate."""
    if n <= 0:
        return 0
    if rate <= 0:
        return 0
    if rate >= 1:
        return n
    log_p, log_q = math.log(rate), math.log1p(-rate)
    terms = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
             + k * log_p + (n - k) * log_q for k in range(n + 1)]
    tail = 0.0  # P(X >= k), summed from the top
    for k in range(n, -1, -1):
        tail += math.exp(terms[k])
        if tail >= alpha:
            return k
    return 0


def top1_verdict(agree: int, samples: int, floor: NoiseFloor | None, ties: int = 0
                 ) -> tuple[bool, str]:
    """Pass/fail and the reported line of a top-1 agreement count (see module docstring);
    ``ties`` of the disagreements are rounding ties (:func:`tie_margin`) and do not count."""
    k = samples - agree - ties
    rate = 1.0 - TOP1_MIN
    why = f"{1 - TOP1_MIN:.1%} allowed"
    if floor is not None and floor.samples and FLOOR_MARGIN * floor.rate > rate:
        rate = FLOOR_MARGIN * floor.rate
        why = f"{rate:.1%} allowed: {FLOOR_MARGIN:g}x the noise floor's {floor.flips} flips"
    bound = binom_upper(samples, rate)
    ok = k <= bound
    tied = (f" beyond {ties} rounding tie{'s' if ties > 1 else ''} (reference margin within "
            f"{FLOOR_MARGIN:g}x the noise floor's largest difference)" if ties else "")
    return ok, (f"{agree / samples:.2%}: {k} of {samples} samples disagree{tied}, at most "
                f"{bound} ({why}, 1-in-{round(1 / FALSE_ALARM)} false alarm)")


def mean_limit(variant: str, floor: NoiseFloor | None, step: float) -> float:
    """Largest mean |ORT - PyTorch| (absolute units) that is still rounding noise."""
    margin, minimum = MEAN_LIMIT.get(variant, MEAN_LIMIT["int8"])
    floor_mean = floor.mean_abs if floor is not None else 0.0
    return max(minimum * step, margin * floor_mean)


def non_finite(arrays: Sequence[np.ndarray]) -> int:
    """How many elements of ``arrays`` are NaN or infinite."""
    return int(sum(int(a.size - np.isfinite(a).sum()) for a in arrays))


def float64_reference(model: nn.Module) -> nn.Module | None:
    """A float64 copy of ``model`` (the other rounding order), or None if it cannot run so."""
    try:
        return copy.deepcopy(model).double().eval()
    except (RuntimeError, TypeError):
        return None


@torch.no_grad()
def noise_floor(model64: nn.Module | None, batches: Sequence[tuple[tuple[torch.Tensor, ...], int,
                                                                  bool]],
                refs: Sequence[Sequence[np.ndarray]],
                split: Callable[[list], list] | None = None) -> list[NoiseFloor] | None:
    """One :class:`NoiseFloor` per output: ``model64`` against the float32 ``refs`` on
    ``batches`` (``(inputs, n_valid, counts_for_top1)``); None if float64 fails. ``split``
    turns the model's outputs into the checked ones (declared slices)."""
    if model64 is None:
        return None
    sums: list[float] = []
    counts: list[int] = []
    flips: list[int] = []
    samples: list[int] = []
    peaks: list[float] = []
    for (inputs, n, top1), ref in zip(batches, refs):
        try:
            out = model64(*(t.double() for t in inputs))
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        outs = [o.detach().cpu().numpy() for o in leaves(out)]
        outs = split(outs) if split is not None else outs
        if len(sums) < len(outs):
            sums, counts = [0.0] * len(outs), [0] * len(outs)
            flips, samples, peaks = [0] * len(outs), [0] * len(outs), [0.0] * len(outs)
        for i, (o, r) in enumerate(zip(outs, ref)):
            o64 = o[:n]
            r = r[:n].astype(np.float64)
            if o64.shape != r.shape:
                return None
            d = np.abs(o64 - r)
            d = d[np.isfinite(d)]
            sums[i] += float(d.sum())
            counts[i] += d.size
            peaks[i] = max(peaks[i], float(d.max(initial=0.0)))
            if top1 and r.ndim == 2 and r.shape[1] > 1:
                flips[i] += int((o64.argmax(1) != r.argmax(1)).sum())
                samples[i] += r.shape[0]
    return [NoiseFloor(s / max(c, 1), f, m, p)
            for s, c, f, m, p in zip(sums, counts, flips, samples, peaks)]


def tie_margin(floor: NoiseFloor | None) -> float:
    """A top-1 disagreement on a sample whose reference logits are closer than this (top-1
    minus top-2) is a rounding tie: the model's own float64 rerun moves single outputs up to
    ``floor.max_abs``, so two orders of rounding may move them twice as far."""
    return FLOOR_MARGIN * floor.max_abs if floor is not None else 0.0


@dataclass(frozen=True)
class HalfFloor(NoiseFloor):
    """PyTorch's own run in another float type against its float32 run, one output: the
    largest difference relative to the output's largest value, and top-1 flips
    (``mean_abs`` is the mean difference). In float16 (fp16 variants): what fp16 arithmetic
    alone does to this model, as a deep untrained model can drift beyond the fp16 variant's
    fixed tolerance with no export bug at all. In float64 (fp32): PyTorch's own float32
    rounding error, which grows with the output's magnitude and the model's depth."""

    max_rel: float = 0.0


# fp32: ORT's float32 error may reach this many times PyTorch's own float32 error (measured
# against PyTorch in float64). |ORT - PT32| <= |ORT - PT64| + |PT32 - PT64|: a margin of 4
# lets ORT's kernels, which block their float32 sums differently, round up to 3x as far.
FP32_FLOOR_MARGIN = 4.0
# variants checked by a relative tolerance that compute in float32 (int4: float32 arithmetic
# on the very weights of the PyTorch model, so only float32 rounding differs)
FLOAT32_RUNS = frozenset(v.name for v in TABLE if v.rel_tol is not None and not v.fp16)


def floor_margin(variant: str) -> float:
    """How many times PyTorch's own drift (:func:`half_floor`) a variant may drift."""
    return FP32_FLOOR_MARGIN if variant in FLOAT32_RUNS else FLOOR_MARGIN


def floor_dtype(variant: str) -> torch.dtype:
    """The float type :func:`half_floor` reruns PyTorch in for ``variant``: float64 for
    fp32 and int4 (their own float32 error), float16 otherwise."""
    return torch.float64 if variant in FLOAT32_RUNS else torch.float16


@torch.no_grad()
def _repeats(model: nn.Module, batches: Sequence[tuple[tuple[torch.Tensor, ...], int, bool]],
             refs: Sequence[Sequence[np.ndarray]], split: Callable[[list], list] | None) -> bool:
    """``model`` gives ``refs`` again, bit for bit, on the same inputs."""
    for (inputs, n, _), ref in zip(batches, refs):
        outs = [o.detach().float().cpu().numpy() for o in leaves(model(*inputs))]
        outs = split(outs) if split is not None else outs
        if len(outs) != len(ref) or not all(
                np.array_equal(o[:n], np.asarray(r)[:n], equal_nan=True)
                for o, r in zip(outs, ref)):
            return False
    return True


@torch.no_grad()
def half_floor(model: nn.Module, batches: Sequence[tuple[tuple[torch.Tensor, ...], int, bool]],
               refs: Sequence[Sequence[np.ndarray]],
               split: Callable[[list], list] | None = None,
               dtype: torch.dtype = torch.float16) -> list[HalfFloor] | None:
    """One :class:`HalfFloor` per output: a ``dtype`` copy of ``model`` (float16, or
    float64 for the fp32 variant's floor) against the float32 ``refs`` on ``batches``;
    None when the model cannot run in ``dtype`` here, or (float64) when ``model`` does not
    repeat ``refs`` on the same inputs: a model that is not deterministic has no floor."""
    try:
        half = copy.deepcopy(model).to(dtype).eval()
    except (RuntimeError, TypeError):
        return None
    if dtype == torch.float64 and not _repeats(model, batches, refs, split):
        return None
    stats: list[list[float]] = []  # per output: max diff, max ref, sum diff, count, flips, n
    for (inputs, n, top1), ref in zip(batches, refs):
        try:
            out = half(*(t.to(dtype) if t.is_floating_point() else t for t in inputs))
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        outs = [o.detach().double().cpu().numpy() for o in leaves(out)]
        outs = split(outs) if split is not None else outs
        while len(stats) < len(outs):
            stats.append([0.0] * 6)
        for s, o, r in zip(stats, outs, ref):
            o, r = o[:n].astype(np.float64), r[:n].astype(np.float64)
            if o.shape != r.shape:
                return None
            d = np.abs(o - r)
            d = d[np.isfinite(d)]
            s[0] = max(s[0], float(d.max(initial=0.0)))
            s[1] = max(s[1], float(np.abs(r[np.isfinite(r)]).max(initial=0.0)))
            s[2] += float(d.sum())
            s[3] += d.size
            if top1 and r.ndim == 2 and r.shape[1] > 1:
                s[4] += int((o.argmax(1) != r.argmax(1)).sum())
                s[5] += r.shape[0]
    return [HalfFloor(s[2] / max(s[3], 1), int(s[4]), int(s[5]), max_abs=s[0],
                      max_rel=s[0] / max(s[1], float(np.finfo(np.float32).tiny)))
            for s in stats]

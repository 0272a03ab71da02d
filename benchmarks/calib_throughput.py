"""Histogram-calibration throughput beside a plain ``torch.histc`` over the same batches.

For each method, a fresh :class:`HistogramCalibrator` collects every batch and then computes
amax; the baseline histograms each batch with ``torch.histc(x, bins)`` (which finds the data
range itself). Runs are interleaved (the order rotates every repeat) and medians reported,
so a noisy machine slows all variants alike. Run ``python benchmarks/calib_throughput.py -h``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtqat.quant.calib.histogram import HistogramCalibrator  # noqa: E402
from trtqat.quant.calib.registry import methods  # noqa: E402

METHODS = methods()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="32x64x56x56", help="batch shape, e.g. 32x64x56x56")
    p.add_argument("--batches", type=int, default=4, help="batches per calibration run")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median)")
    p.add_argument("--num-bins", type=int, default=2048)
    p.add_argument("--axis", type=int, default=None, help="per-channel axis (default: tensor)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Print throughput (elements/s) per method and histc; return the medians (seconds)."""
    args = _parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shape = tuple(int(s) for s in args.shape.lower().split("x"))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    gen = torch.Generator(device="cpu").manual_seed(0)
    # the scale grows batch by batch, so the histogram range grows (counts get re-binned)
    batches = [(torch.randn(shape, generator=gen) * (1.0 + 0.1 * i)).to(device)
               for i in range(args.batches)]
    elements = sum(b.numel() for b in batches)

    def histc() -> None:
        for b in batches:
            torch.histc(b, bins=args.num_bins)

    def calibrate(method: str) -> Callable[[], None]:
        def run() -> None:
            cal = HistogramCalibrator(axis=args.axis, num_bins=args.num_bins)
            for b in batches:
                cal.collect(b)
            cal.compute_amax(method)
        return run

    variants: dict[str, Callable[[], None]] = {"torch.histc": histc}
    variants.update({m: calibrate(m) for m in methods})
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            times[name].append(_timed(variants[name], device))
    med = {name: statistics.median(t) for name, t in times.items()}

    where = "per tensor" if args.axis is None else f"axis={args.axis}"
    print(f"histogram calibration, {args.batches} x {args.shape} ({elements / 1e6:.1f} M "
          f"elements), {args.num_bins} bins, {where}, device={device}, "
          f"threads={torch.get_num_threads()}, median of {args.repeats}")
    print(f"{'variant':<14}{'median s':>10}{'M elem/s':>11}{'x histc time':>14}")
    base = med["torch.histc"]
    for name in names:
        label = name if name == "torch.histc" else f"{name}"
        print(f"{label:<14}{med[name]:>10.3f}{elements / med[name] / 1e6:>11.1f}"
              f"{med[name] / base:>14.2f}")
    print("(collect + compute_amax per method; target: within 2x of torch.histc)")
    return med


if __name__ == "__main__":
    main()

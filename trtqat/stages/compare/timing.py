"""Interleaved timing: every variant is measured in each of several rounds, in turn.

Measured one after another on a shared machine, two identical engines can differ 3x (the
load changes between them). Rounds spread each variant's measurement over the whole run,
each round in a rotated order, and the report gives the median over rounds with its
spread, ``(max - min) / median``; the report flags a spread above 10%.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtqat.stages.compare.report import VariantResult

ROUNDS = 3


@dataclass
class Timed:
    """A variant ready to time: its result, engine, runner options and a feed per batch."""

    result: VariantResult
    engine: Any
    runner_kwargs: Mapping[str, Any]
    feeds: Mapping[int, Mapping[str, Any]]


def spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of ``values`` (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def time_interleaved(items: Sequence[Timed], batch_sizes: Sequence[int], duration_s: float,
                     warmup_ms: float, rounds: int = ROUNDS,
                     echo: Callable[[str], None] = print) -> None:
    """Benchmark every item at every batch size in ``rounds`` rotated rounds of
    ``duration_s / rounds`` each; fills latency, throughput and their spreads."""
    from trtqat.engines import BenchmarkSettings

    rounds = max(1, rounds)
    per_round = duration_s / rounds
    with contextlib.ExitStack() as stack:
        runners = [stack.enter_context(t.engine.runner(**t.runner_kwargs)) for t in items]
        lat: list[dict[int, list[float]]] = [{b: [] for b in batch_sizes} for _ in items]
        thr: list[dict[int, list[float]]] = [{b: [] for b in batch_sizes} for _ in items]
        for r in range(rounds):
            echo(f"timing round {r + 1}/{rounds} ...")
            order = list(range(len(items)))
            order = order[r % len(order):] + order[:r % len(order)] if order else order
            for i in order:
                if items[i].result.status != "ok":
                    continue
                for b in batch_sizes:
                    settings = BenchmarkSettings(warmup_ms=warmup_ms, duration_s=per_round,
                                                 batch=b)
                    try:
                        bench = runners[i].benchmark(dict(items[i].feeds[b]), settings)
                    except Exception as exc:  # one backend crash must not lose the others
                        items[i].result.status = "failed"
                        items[i].result.error = f"timing: {type(exc).__name__}: {exc}"[:300]
                        break
                    lat[i][b].append(float(bench.stats("latency_ms").median))
                    thr[i][b].append(float(bench.throughput_qps))
    for t, lat_i, thr_i in zip(items, lat, thr):
        res = t.result
        if res.status != "ok":
            continue
        for b in batch_sizes:
            res.latency_ms[b] = statistics.median(lat_i[b])
            res.throughput[b] = statistics.median(thr_i[b])
            res.latency_spread[b] = spread(lat_i[b])
            res.throughput_spread[b] = spread(thr_i[b])
            res.rounds[b] = {"latency_ms": lat_i[b], "throughput": thr_i[b]}

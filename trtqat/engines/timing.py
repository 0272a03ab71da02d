"""trtexec's measurement model: warm-up, duration/iterations, percentiles, summary, traces.

Per query the runner reports enqueue, H2D, compute and D2H start/end times (ms). Queries
that start inside the warm-up window are discarded; the loop runs until at least
``iterations`` queries are counted and ``warm-up + duration`` has passed. Statistics use
trtexec's formulas exactly (percentile in float32, midpoint median, population CoV).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtqat.engines.errors import OptionsError
from trtqat.engines.fileformat import atomic_write

if TYPE_CHECKING:
    from trtqat.engines.base import Runner

ENQUEUE_BOUND_RATIO = 0.8
UNSTABLE_COV_PERCENT = 2.5
# What the summary advises for unstable timings. It names only flags that trtqat-exec
# accepts (tests/faults checks every flag named in this module against its parser);
# trtexec's own text also suggests its spin-wait flag: name it here once trtqat-exec has it.
# What the summary advises when compute time is unstable; every flag named here is one
# trtqat-exec accepts (a test checks).
UNSTABLE_ADVICE = "  If not already in use, {hint} may improve the stability."
UNSTABLE_HINTS = {"GPU": "locking GPU clock frequency or adding --useSpinWait",
                  "other": "fixing --threads or running on an otherwise idle machine"}


@dataclass(frozen=True)
class BenchmarkSettings:
    """trtexec's flags: --warmUp (ms), --duration (s), --iterations, --avgRuns, --percentile."""

    warmup_ms: float = 200.0
    duration_s: float = 3.0
    iterations: int = 10
    avg_runs: int = 10
    percentiles: tuple[float, ...] = (90.0, 95.0, 99.0)
    data_transfers: bool | None = None  # None: the backend's default
    cuda_graph: bool | None = None
    batch: int = 1

    def __post_init__(self) -> None:
        if not (self.warmup_ms >= 0 and math.isfinite(self.warmup_ms)):
            raise OptionsError(f"--warmUp must be >= 0 ms, got {self.warmup_ms}")
        if not (self.duration_s >= 0 and math.isfinite(self.duration_s)):
            raise OptionsError(f"--duration must be >= 0 s, got {self.duration_s}")
        if self.iterations < 1 or self.avg_runs < 1 or self.batch < 1:
            raise OptionsError("--iterations, --avgRuns and the batch must be >= 1")
        if not self.percentiles or not all(0 <= p <= 100 for p in self.percentiles):
            raise OptionsError(f"--percentile values must be in 0..100, got {self.percentiles}")


@dataclass(frozen=True)
class QueryTimes:
    """Start/end (ms) of one query's enqueue, H2D copy, compute and D2H copy."""

    enq_start: float
    enq_end: float
    h2d_start: float
    h2d_end: float
    compute_start: float
    compute_end: float
    d2h_start: float
    d2h_end: float

    enqueue_ms = property(lambda self: self.enq_end - self.enq_start, doc="Enqueue time (ms).")
    h2d_ms = property(lambda self: self.h2d_end - self.h2d_start, doc="H2D copy time (ms).")
    compute_ms = property(lambda self: self.compute_end - self.compute_start,
                          doc="Compute time (ms).")
    d2h_ms = property(lambda self: self.d2h_end - self.d2h_start, doc="D2H copy time (ms).")

    @property
    def latency_ms(self) -> float:
        return self.h2d_ms + self.compute_ms + self.d2h_ms

    def shifted(self, origin: float) -> QueryTimes:
        return QueryTimes(*(v - origin for v in asdict(self).values()))

    def to_json(self) -> dict[str, float]:
        """trtexec's --exportTimes record."""
        return {"startEnqMs": self.enq_start, "endEnqMs": self.enq_end,
                "startH2dMs": self.h2d_start, "endH2dMs": self.h2d_end,
                "startComputeMs": self.compute_start, "endComputeMs": self.compute_end,
                "startD2hMs": self.d2h_start, "endD2hMs": self.d2h_end,
                "h2dMs": self.h2d_ms, "computeMs": self.compute_ms, "d2hMs": self.d2h_ms,
                "latencyMs": self.latency_ms}


def percentile(p: float, sorted_values: Sequence[float]) -> float:
    """trtexec's findPercentile: ``exclude = int((1 - p/100) * N)`` in float32."""
    n = len(sorted_values)
    if n == 0:
        return math.inf
    exclude = int((np.float32(1) - np.float32(p) / np.float32(100)) * np.float32(n))
    return float(sorted_values[max(n - 1 - exclude, 0)])


def median(sorted_values: Sequence[float]) -> float:
    """trtexec's findMedian: the middle value, or the mean of the two middle values."""
    n = len(sorted_values)
    if n == 0:
        return math.inf
    if n % 2:
        return float(sorted_values[n // 2])
    return (float(sorted_values[n // 2]) + float(sorted_values[n // 2 - 1])) / 2


def coefficient_of_variance(values: Sequence[float]) -> float:
    """Population standard deviation / mean x 100 (0 when the mean is 0)."""
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    if mean == 0:
        return 0.0
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean * 100.0


@dataclass(frozen=True)
class Stats:
    """min/max/mean/median/percentiles of one metric (ms)."""

    min: float
    max: float
    mean: float
    median: float
    percentiles: dict[float, float] = field(default_factory=dict)
    cov: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float], percentiles: Sequence[float]) -> Stats:
        ordered = sorted(values)
        if not ordered:
            return cls(math.inf, math.inf, math.inf, math.inf,
                       {p: math.inf for p in percentiles}, 0.0)
        return cls(ordered[0], ordered[-1], sum(ordered) / len(ordered), median(ordered),
                   {p: percentile(p, ordered) for p in percentiles},
                   coefficient_of_variance(ordered))

    def line(self) -> str:
        """``min = X ms, max = ..., percentile(90%) = ... ms`` (C++ stream formatting)."""
        parts = [f"min = {self.min:g} ms", f"max = {self.max:g} ms", f"mean = {self.mean:g} ms",
                 f"median = {self.median:g} ms"]
        parts += [f"percentile({p:g}%) = {v:g} ms" for p, v in self.percentiles.items()]
        return ", ".join(parts)


def measure(query: Callable[[], QueryTimes], settings: BenchmarkSettings,
            clock: Callable[[], float] = time.perf_counter) -> tuple[list[QueryTimes], int]:
    """Run queries one at a time until ``iterations`` are counted and warm-up + duration has
    passed (see :func:`measure_pipelined`)."""
    done: list[QueryTimes] = []
    return measure_pipelined(lambda: done.append(query()), lambda: done.pop(), 1, settings,
                             clock)


def measure_pipelined(submit: Callable[[], None], collect: Callable[[], QueryTimes], depth: int,
                      settings: BenchmarkSettings,
                      clock: Callable[[], float] = time.perf_counter
                      ) -> tuple[list[QueryTimes], int]:
    """trtexec's loop with ``depth`` queries in flight: ``submit()`` enqueues one query,
    ``collect()`` waits for the oldest and returns its times.

    Runs until ``iterations`` queries are counted and ``warm-up + duration`` has passed, then
    collects what is still in flight. Returns the counted queries (times in ms from the start
    of the run) and the number of warm-up queries discarded (those that started inside the
    warm-up window).
    """
    if depth < 1:
        raise OptionsError(f"in-flight depth must be >= 1, got {depth}")
    origin = clock() * 1000.0
    warm_end = origin + settings.warmup_ms
    stop_at = warm_end + settings.duration_s * 1000.0
    counted: list[QueryTimes] = []
    warmups = in_flight = 0
    stopping = False
    while not stopping or in_flight:
        while not stopping and in_flight < depth:
            submit()
            in_flight += 1
        times = collect()
        in_flight -= 1
        start = min(times.enq_start, times.h2d_start, times.compute_start)
        if start >= warm_end:
            counted.append(times.shifted(origin))
        else:
            warmups += 1
        if len(counted) >= settings.iterations and clock() * 1000.0 >= stop_at:
            stopping = True
    return counted, warmups


@dataclass
class BenchmarkResult:
    """Counted queries plus trtexec's summary statistics."""

    queries: list[QueryTimes]
    settings: BenchmarkSettings
    warmup_queries: int = 0
    data_transfers: bool = True
    cuda_graph: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    # A synchronous backend (ONNX Runtime) computes inside the enqueue call, so its enqueue
    # time always contains the compute time and trtexec's enqueue-bound check cannot apply.
    synchronous: bool = False
    # Where compute is timed: "GPU" (TensorRT's CUDA events), "CPU" or "Host" (ONNX Runtime's
    # host clock around a synchronous run, on the CPU or another provider).
    compute_label: str = "GPU"

    def _values(self, attr: str) -> list[float]:
        return [getattr(q, attr) for q in self.queries]

    def stats(self, attr: str) -> Stats:
        """Stats of ``latency_ms``, ``enqueue_ms``, ``h2d_ms``, ``compute_ms`` or ``d2h_ms``."""
        return Stats.of(self._values(attr), self.settings.percentiles)

    # trtexec's summary figures (ms): min, max, mean, median, percentiles and spread (cov, %)
    latency = property(lambda self: self.stats("latency_ms"), doc="Host latency (H2D + "
                       "compute + D2H) statistics, ms.")
    compute = property(lambda self: self.stats("compute_ms"), doc="Compute time statistics.")
    enqueue = property(lambda self: self.stats("enqueue_ms"), doc="Enqueue time statistics.")

    @property
    def walltime_ms(self) -> float:
        """From the first counted query's start to the last one's end (the earliest start and
        latest end: with several inference streams queries overlap)."""
        if not self.queries:
            return 0.0
        if self.data_transfers:
            return (max(q.d2h_end for q in self.queries)
                    - min(q.h2d_start for q in self.queries))
        return (max(q.compute_end for q in self.queries)
                - min(q.compute_start for q in self.queries))

    @property
    def throughput_qps(self) -> float:
        wall = self.walltime_ms
        return self.settings.batch * len(self.queries) / wall * 1000.0 if wall > 0 else 0.0

    def warnings(self) -> list[str]:
        """trtexec's warnings after the summary (enqueue-bound, transfer-bound, unstable)."""
        enq, h2d = self.stats("enqueue_ms"), self.stats("h2d_ms")
        gpu, d2h = self.stats("compute_ms"), self.stats("d2h_ms")
        out, dev = [], self.compute_label
        if not self.synchronous and enq.median > ENQUEUE_BOUND_RATIO * gpu.median:
            out += [f"* Throughput may be bound by Enqueue Time rather than {dev} Compute and the "
                    f"{dev} may be under-utilized.",
                    "  If not already in use, --useCudaGraph (utilize CUDA graphs where possible) "
                    "may increase the throughput."]
        if h2d.median >= gpu.median:
            out += ["* Throughput may be bound by host-to-device transfers for the inputs rather "
                    f"than {dev} Compute and the {dev} may be under-utilized.",
                    "  Add --noDataTransfers flag to disable data transfers."]
        if d2h.median >= gpu.median:
            out += ["* Throughput may be bound by device-to-host transfers for the outputs rather "
                    f"than {dev} Compute and the {dev} may be under-utilized.",
                    "  Add --noDataTransfers flag to disable data transfers."]
        if gpu.cov > UNSTABLE_COV_PERCENT:
            hint = UNSTABLE_HINTS["GPU" if dev == "GPU" else "other"]
            out += [f"* {dev} compute time is unstable, with coefficient of variance = "
                    f"{gpu.cov:g}%.", UNSTABLE_ADVICE.format(hint=hint)]
        return out

    def summary_lines(self) -> list[str]:
        """The ``=== Performance summary ===`` block, line by line, in trtexec's order."""
        total_compute_s = sum(self._values("compute_ms")) / 1000.0
        return [
            "=== Performance summary ===",
            f"Throughput: {self.throughput_qps:g} qps",
            f"Latency: {self.stats('latency_ms').line()}",
            f"Enqueue Time: {self.stats('enqueue_ms').line()}",
            f"H2D Latency: {self.stats('h2d_ms').line()}",
            f"{self.compute_label} Compute Time: {self.stats('compute_ms').line()}",
            f"D2H Latency: {self.stats('d2h_ms').line()}",
            f"Total Host Walltime: {self.walltime_ms / 1000.0:g} s",
            f"Total {self.compute_label} Compute Time: {total_compute_s:g} s",
            *self.warnings(),
        ]

    def trace_lines(self) -> list[str]:
        """trtexec's lines after the run: warm-up and timing-trace counts."""
        return [f"Warmup completed {self.warmup_queries} queries over "
                f"{self.settings.warmup_ms:g} ms",
                f"Timing trace has {len(self.queries)} queries over "
                f"{self.walltime_ms / 1000.0:g} s"]

    def average_lines(self) -> list[str]:
        """trtexec's ``Average on N runs - GPU latency: ... - Host latency: ...`` lines."""
        n = self.settings.avg_runs
        lines = []
        for i in range(0, len(self.queries) - n + 1, n):
            group = self.queries[i:i + n]
            gpu = sum(q.compute_ms for q in group) / n
            host = sum(q.latency_ms for q in group) / n
            enq = sum(q.enqueue_ms for q in group) / n
            lines.append(f"Average on {n} runs - GPU latency: {gpu:g} ms - Host latency: "
                         f"{host:g} ms (enqueue {enq:g} ms)")
        return lines

    def export_times(self, path: str | os.PathLike[str]) -> Path:
        """Write trtexec's --exportTimes JSON (one object per counted query), atomically."""
        text = json.dumps([q.to_json() for q in self.queries], indent=2)
        return atomic_write(path, text.encode() + b"\n")

    def to_dict(self) -> dict[str, Any]:
        """Configuration and summary numbers, for reports."""
        return {"settings": asdict(self.settings), "config": self.config,
                "data_transfers": self.data_transfers, "cuda_graph": self.cuda_graph,
                "queries": len(self.queries), "throughput_qps": self.throughput_qps,
                "walltime_s": self.walltime_ms / 1000.0,
                **{name: asdict(self.stats(attr)) for name, attr in (
                    ("latency", "latency_ms"), ("enqueue", "enqueue_ms"), ("h2d", "h2d_ms"),
                    ("compute", "compute_ms"), ("d2h", "d2h_ms"))}}


def run_benchmark(runner: Runner, feed: dict[str, np.ndarray],
                  settings: BenchmarkSettings) -> BenchmarkResult:
    """Set the runner up for fixed shapes, measure, tear down (feed already checked)."""
    transfers = (runner.default_data_transfers if settings.data_transfers is None
                 else settings.data_transfers)
    graph = runner.default_cuda_graph if settings.cuda_graph is None else settings.cuda_graph
    runner._bench_setup_impl(feed, transfers, graph)
    try:
        queries, warmups = measure_pipelined(lambda: runner._submit_impl(transfers),
                                             runner._collect_impl, runner.inflight_depth,
                                             settings)
        used_graph = bool(getattr(runner, "graph_in_use", graph))
    finally:
        runner._bench_teardown_impl()
    return BenchmarkResult(queries, settings, warmups, data_transfers=transfers,
                           cuda_graph=used_graph,
                           synchronous=bool(getattr(runner, "synchronous", False)),
                           compute_label=runner.compute_label,
                           config={"backend": runner.engine.backend,
                                   "backend_version": runner.engine.header.get("backend_version"),
                                   "shapes": {k: list(v.shape) for k, v in feed.items()}})

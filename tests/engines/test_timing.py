"""trtexec's measurement model: percentiles, median, CoV, summary block, warnings, traces."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from trtqat.engines import OptionsError
from trtqat.engines.timing import (
    BenchmarkResult,
    BenchmarkSettings,
    QueryTimes,
    Stats,
    coefficient_of_variance,
    measure,
    median,
    percentile,
)


def trtexec_percentile(p: float, values: list[float]) -> float:
    """findPercentile from trtexec's sampleReporting.cpp, transcribed with float32 maths."""
    n = len(values)
    if n == 0:
        return math.inf
    exclude = int(np.float32(np.float32(1) - np.float32(p) / np.float32(100)) * np.float32(n))
    return sorted(values)[max(n - 1 - exclude, 0)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 11, 99, 100, 101, 1000, 1234])
@pytest.mark.parametrize("p", [0, 1, 50, 90, 95, 99, 99.9, 100])
def test_percentile_matches_trtexec_formula(n: int, p: float) -> None:
    values = list(np.random.default_rng(n).permutation(n).astype(float))
    assert percentile(p, sorted(values)) == trtexec_percentile(p, values)


def test_percentile_float32_edge_cases() -> None:
    values = [float(v) for v in range(1, 101)]
    # (1 - 0.99f) * 100 = 0.99999905 in float32 -> nothing excluded -> the maximum. In
    # float64 it would be 1.0000000000000009 -> one excluded -> 99.
    assert percentile(99, values) == 100.0
    assert int((1 - 99 / 100) * 100) == 1  # the float64 trap the implementation avoids
    assert percentile(90, [float(v) for v in range(1, 11)]) == 9.0  # 1-0.9f = 0.10000002
    assert percentile(0, values) == 1.0  # exclude N -> clamped to index 0
    assert percentile(100, values) == 100.0
    assert percentile(50, [5.0]) == 5.0
    assert percentile(95, []) == math.inf


def test_median_and_cov() -> None:
    assert median([1.0, 2.0, 3.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert median([]) == math.inf
    values = [1.0, 2.0, 3.0, 4.0]
    assert coefficient_of_variance(values) == pytest.approx(np.std(values) / np.mean(values) * 100)
    assert coefficient_of_variance([0.0, 0.0]) == 0.0
    stats = Stats.of([3.0, 1.0, 2.0], (90.0, 99.0))
    assert (stats.min, stats.max, stats.mean, stats.median) == (1.0, 3.0, 2.0, 2.0)
    assert stats.line() == ("min = 1 ms, max = 3 ms, mean = 2 ms, median = 2 ms, "
                            "percentile(90%) = 3 ms, percentile(99%) = 3 ms")


def q(start: float, h2d: float, compute: float, d2h: float, enqueue: float) -> QueryTimes:
    t1, t2 = start + h2d, start + h2d + compute
    return QueryTimes(t1, t1 + enqueue, start, t1, t1, t2, t2, t2 + d2h)


def result(queries: list[QueryTimes], **kw) -> BenchmarkResult:
    return BenchmarkResult(queries, BenchmarkSettings(**kw), warmup_queries=3)


SUMMARY_PREFIXES = ["=== Performance summary ===", "Throughput: ", "Latency: ", "Enqueue Time: ",
                    "H2D Latency: ", "GPU Compute Time: ", "D2H Latency: ",
                    "Total Host Walltime: ", "Total GPU Compute Time: "]


def test_summary_block_layout_and_numbers() -> None:
    queries = [q(10.0 * i, 0.1, 2.0, 0.2, 0.5) for i in range(10)]
    lines = result(queries).summary_lines()
    assert len(lines) == len(SUMMARY_PREFIXES)  # stable compute, no warnings
    for line, prefix in zip(lines, SUMMARY_PREFIXES):
        assert line.startswith(prefix), (line, prefix)
    walltime_ms = queries[-1].d2h_end - queries[0].h2d_start
    assert lines[1] == f"Throughput: {10 / walltime_ms * 1000:g} qps"
    assert lines[2] == ("Latency: min = 2.3 ms, max = 2.3 ms, mean = 2.3 ms, median = 2.3 ms, "
                        "percentile(90%) = 2.3 ms, percentile(95%) = 2.3 ms, "
                        "percentile(99%) = 2.3 ms")
    assert lines[5].startswith("GPU Compute Time: min = 2 ms, max = 2 ms")
    assert lines[7] == f"Total Host Walltime: {walltime_ms / 1000:g} s"
    assert lines[8] == "Total GPU Compute Time: 0.02 s"
    assert result(queries).trace_lines() == [
        "Warmup completed 3 queries over 200 ms",
        f"Timing trace has 10 queries over {walltime_ms / 1000:g} s"]


def test_walltime_without_transfers_uses_compute() -> None:
    queries = [q(10.0 * i, 1.0, 2.0, 1.0, 0.5) for i in range(3)]
    res = BenchmarkResult(queries, BenchmarkSettings(), data_transfers=False)
    assert res.walltime_ms == pytest.approx(queries[-1].compute_end - queries[0].compute_start)
    assert res.throughput_qps == pytest.approx(3 / res.walltime_ms * 1000)


def warnings_for(h2d: float, compute: float, d2h: float, enqueue: float,
                 jitter: float = 0.0) -> list[str]:
    # binary-exact times (multiples of 1/64) keep the threshold comparisons exact
    queries = [q(16.0 * i, h2d, compute + (jitter if i % 2 else -jitter), d2h, enqueue)
               for i in range(20)]
    return [w for w in result(queries).warnings() if w.startswith("*")]


def test_warnings_thresholds_and_order() -> None:
    assert warnings_for(0.125, 1.25, 0.125, 1.0) == []  # enqueue == 0.8 x compute: not bound
    enq = warnings_for(0.125, 1.25, 0.125, 1.015625)
    assert enq == ["* Throughput may be bound by Enqueue Time rather than GPU Compute and the "
                   "GPU may be under-utilized."]
    h2d = warnings_for(1.25, 1.25, 0.125, 0.125)  # H2D >= compute
    assert h2d == ["* Throughput may be bound by host-to-device transfers for the inputs rather "
                   "than GPU Compute and the GPU may be under-utilized."]
    assert warnings_for(0.125, 1.25, 1.5, 0.125)[0].startswith(
        "* Throughput may be bound by device-to-host")
    assert warnings_for(0.125, 1.0, 0.125, 0.125, jitter=0.0245) == []  # CoV 2.45 %: stable
    unstable = warnings_for(0.125, 1.0, 0.125, 0.125, jitter=0.0255)
    assert len(unstable) == 1
    assert unstable[0].startswith("* GPU compute time is unstable, with coefficient of "
                                  "variance = 2.55")
    everything = warnings_for(2.0, 1.0, 2.0, 0.875, jitter=0.5)
    assert [w.split(" ")[6] for w in everything[:3]] == ["Enqueue", "host-to-device",
                                                         "device-to-host"]
    assert everything[3].startswith("* GPU compute time is unstable")
    lines = result([q(16.0 * i, 2.0, 1.0, 2.0, 0.875) for i in range(5)]).summary_lines()
    assert lines[9].startswith("* Throughput may be bound by Enqueue")
    assert lines[10] == ("  If not already in use, --useCudaGraph (utilize CUDA graphs where "
                         "possible) may increase the throughput.")
    assert lines[12] == "  Add --noDataTransfers flag to disable data transfers."


def test_custom_percentiles_and_average_lines() -> None:
    queries = [q(10.0 * i, 0.0, float(i + 1), 0.0, 0.5) for i in range(25)]
    res = result(queries, percentiles=(50.0, 99.9), avg_runs=10)
    assert res.summary_lines()[5].endswith("percentile(50%) = 13 ms, percentile(99.9%) = 25 ms")
    avg = res.average_lines()
    assert len(avg) == 2  # only complete groups of avg_runs
    assert avg[0] == ("Average on 10 runs - GPU latency: 5.5 ms - Host latency: 5.5 ms "
                      "(enqueue 0.5 ms)")


def test_export_times_json(tmp_path) -> None:
    queries = [q(10.0 * i, 0.1, 2.0, 0.2, 0.5) for i in range(4)]
    path = result(queries).export_times(tmp_path / "sub" / "times.json")
    data = json.loads(path.read_text())
    assert isinstance(data, list) and len(data) == 4
    keys = ["startEnqMs", "endEnqMs", "startH2dMs", "endH2dMs", "startComputeMs",
            "endComputeMs", "startD2hMs", "endD2hMs", "h2dMs", "computeMs", "d2hMs", "latencyMs"]
    for record, query in zip(data, queries):
        assert list(record) == keys
        compute = record["endComputeMs"] - record["startComputeMs"]
        assert record["computeMs"] == pytest.approx(compute)
        assert record["latencyMs"] == pytest.approx(query.latency_ms)
    assert sorted(p.name for p in path.parent.iterdir()) == ["times.json"]  # no temp files


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0  # integer milliseconds: no rounding drift

    def __call__(self) -> float:
        return self.now_ms / 1000.0


def test_measure_discards_warmup_and_honours_duration_and_iterations() -> None:
    clock = FakeClock()
    counter = itertools.count()

    def query(step_ms: int) -> QueryTimes:
        next(counter)
        start = float(clock.now_ms)
        clock.now_ms += step_ms
        return q(start, 0.0, step_ms, 0.0, step_ms)

    settings = BenchmarkSettings(warmup_ms=100, duration_s=0.5, iterations=10)
    counted, warmups = measure(lambda: query(10), settings, clock)
    assert warmups == 10  # queries starting at 0, 10, ..., 90 ms
    assert counted[0].compute_start == pytest.approx(100.0)  # relative to the run's start
    assert len(counted) == 50  # until warm-up + duration = 600 ms
    # slow queries: the iteration minimum wins over the duration
    clock.now_ms = 0
    counted, warmups = measure(lambda: query(400), settings, clock)
    assert (warmups, len(counted)) == (1, 10)


def test_settings_are_checked() -> None:
    for bad in ({"warmup_ms": -1}, {"duration_s": float("nan")}, {"iterations": 0},
                {"avg_runs": 0}, {"percentiles": (101.0,)}, {"percentiles": ()}):
        with pytest.raises(OptionsError):
            BenchmarkSettings(**bad)


def test_synchronous_backend_skips_only_the_enqueue_bound_check() -> None:
    queries = [q(16.0 * i, 0.125, 1.25, 0.125, 1.25) for i in range(20)]
    asynchronous = [w for w in result(queries).warnings() if w.startswith("*")]
    assert asynchronous and "Enqueue Time" in asynchronous[0]
    sync = BenchmarkResult(queries, BenchmarkSettings(), synchronous=True)
    assert not [w for w in sync.warnings() if "Enqueue" in w]
    slow_h2d = [q(16.0 * i, 2.0, 1.25, 0.125, 1.25) for i in range(20)]
    sync_h2d = BenchmarkResult(slow_h2d, BenchmarkSettings(), synchronous=True)
    assert any("host-to-device" in w for w in sync_h2d.warnings())

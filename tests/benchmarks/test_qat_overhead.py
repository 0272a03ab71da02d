"""benchmarks/qat_overhead.py: --repeat-process (fresh processes, median of medians, the
ordering verdict), the host/device verdict of a CUDA row, and the CPU time columns."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import qat_overhead  # noqa: E402
import qat_overhead_repeat as R  # noqa: E402
from qat_step_cuda import bound  # noqa: E402


def _rows(ms: dict[str, float]) -> list[dict]:
    fp = ms["fp32"]
    return [{"model": "m", "variant": v, "ms": t, "ratio": t / fp, "cpu_ms": t,
             "cpu_ratio": t / fp} for v, t in ms.items()] + [{"model": "m", "note": "x"}]


def test_summary_is_the_median_of_medians_and_tells_a_broken_ordering():
    runs = [_rows({"fp32": 10, "a": 11, "b": 20}), _rows({"fp32": 12, "a": 13, "b": 30}),
            _rows({"fp32": 11, "a": 12.5, "b": 25})]
    s = R.summarize(runs)
    a = next(r for r in s["rows"] if r["variant"] == "a")
    assert a["ms"] == 12.5 and a["processes"] == 3 and len(a["ratio_each"]) == 3
    assert s["orderings"]["m"]["held"] is True
    runs.append(_rows({"fp32": 10, "a": 9, "b": 20}))
    s = R.summarize(runs)
    assert s["orderings"]["m"]["held"] is False


def test_children_get_the_options_without_the_repeat():
    argv = ["--models", "r", "--repeat-process", "3", "--json-out=x", "--quick"]
    assert R.strip_option(R.strip_option(argv, "--repeat-process"), "--json-out") == [
        "--models", "r", "--quick"]


@pytest.mark.parametrize("wall, busy, verdict", [(10.0, 2.0, "host"), (10.0, 9.0, "device"),
                                                 (10.0, 6.0, "mixed"), (10.0, None, "?")])
def test_bound_tells_host_from_device(wall, busy, verdict):
    assert bound(wall, wall, busy) == verdict


@pytest.mark.slow
def test_repeat_process_runs_in_fresh_processes_with_cpu_time_columns(capsys):
    rows = qat_overhead.main(["--models", "resnet18", "--batch", "2", "--size", "32",
                              "--steps", "2", "--warmup", "1", "--no-peers", "--no-calib",
                              "--quick", "--threads", "1", "--repeat-process", "2"])
    out = capsys.readouterr().out
    assert "cpu ms" in out and "ordering (fastest first)" in out, out
    fp32 = next(r for r in rows if r["variant"] == "fp32")
    assert fp32["ratio"] == 1.0 and len(fp32["cpu_ms_each"]) == 2
    assert all(r["cpu_ms"] > 0 for r in rows)

"""Helpers shared by the benchmark scripts: thread choice, interleaved timing, results file.

Imported as ``_bench`` (the scripts run as ``python benchmarks/<name>.py``, so this folder is
first on ``sys.path``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def choose_threads(requested: int | None) -> tuple[int, str]:
    """``(threads, why)``: ``requested`` when given, else 2 when the 1-minute load is below
    0.5 per core and 1 on a busy machine (two threads there ran several times slower)."""
    if requested:
        return requested, "given"
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return (2, f"idle (load {load:.2f}/core)") if load < 0.5 else (1, f"busy (load {load:.2f}/core)")


def interleaved(runners: dict[str, Any], feed: dict, rounds: int, warmup: int,
                on_round: Callable[[int, dict[str, list[float]]], None] | None = None
                ) -> dict[str, list[float]]:
    """Milliseconds per ``runner.infer(feed)``, each runner once per round, the order rotated
    every round (after ``warmup`` calls each); ``on_round(r, times)`` after each round."""
    names = list(runners)
    for name in names:
        for _ in range(warmup):
            runners[name].infer(feed)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            runners[name].infer(feed)
            times[name].append((time.perf_counter() - start) * 1e3)
        if on_round is not None:
            on_round(r, times)
    return times


def save_results(out_dir: Path, results: dict[str, Any]) -> Path:
    """Write ``out_dir/results.json`` atomically and say where it is."""
    from trtqat.atomic import write_json

    path = write_json(Path(out_dir) / "results.json", results, default=str)
    print(f"results in {out_dir}")
    return path

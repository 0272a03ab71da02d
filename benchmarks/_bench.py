"""Helpers shared by the benchmark scripts: thread choice, interleaved timing, results file,
seed lists and the per-seed accuracy summary.

Imported as ``_bench`` (the scripts run as ``python benchmarks/<name>.py``, so this folder is
first on ``sys.path``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


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


def parse_seeds(text: str) -> list[int]:
    """``"10-14"`` / ``"0,3,5"`` / ``"1"`` -> the seeds."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        try:
            seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
        except ValueError:
            raise SystemExit(f"--seeds: '{part}' is not a seed or a range like 10-14") from None
    if not seeds:
        raise SystemExit("--seeds: give at least one seed, e.g. --seeds 10-14")
    return seeds


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation of each method's top-1 over the seeds (``runs[i]["top1"]``:
    method -> top-1), the best PTQ calibrator by mean (methods named ``"ptq ..."``), and
    QAT paired with it seed by seed (wins / ties / losses and the differences)."""
    methods = list(runs[0]["top1"])
    stats = {m: {"mean": statistics.mean(r["top1"][m] for r in runs),
                 "std": statistics.stdev(r["top1"][m] for r in runs) if len(runs) > 1 else 0.0,
                 "mean_val_loss": statistics.mean(r["val_loss"][m] for r in runs)}
             for m in methods}
    ptq = [m for m in methods if m.startswith("ptq ")]
    best = max(ptq, key=lambda m: stats[m]["mean"])  # the first best, in the runs' order
    diffs = [r["top1"]["qat"] - r["top1"][best] for r in runs]
    eps = 1e-9
    return {"stats": stats, "best_ptq": best,
            "qat_minus_best_ptq": stats["qat"]["mean"] - stats[best]["mean"],
            "qat_minus_fp32": stats["qat"]["mean"] - stats["fp32"]["mean"],
            "best_ptq_minus_fp32": stats[best]["mean"] - stats["fp32"]["mean"],
            "paired": {"wins": sum(d > eps for d in diffs), "ties": sum(abs(d) <= eps for d in diffs),
                       "losses": sum(d < -eps for d in diffs), "diffs": diffs}}


def ort_ptq(fp32: Path, path: Path, feeds: list[dict[str, np.ndarray]]) -> Path:
    """``fp32`` quantized by onnxruntime's quantize_static (QDQ, uint8 activations, int8
    per-channel weights, MinMax calibration on ``feeds``), written to ``path`` ("ORT PTQ",
    the baseline of zoo.py and engine_speed.py)."""
    import logging

    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "please consider pre-processing" warnings
    try:
        quantize_static(str(fp32), str(path), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True)
    finally:
        root.setLevel(level)
    return path

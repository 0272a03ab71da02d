"""``trtqat.build_engine`` and ``trtqat.benchmark``: what ``trtqat build`` and
``trtqat-exec`` do, as calls that return typed results (and load no torch)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import trtqat
from trtqat.engines import InputError, OptionsError, load_engine
from trtqat.engines.timing import Stats

QUICK = {"duration": 0.05, "warmup": 0.0, "iterations": 20}


def test_build_engine_saves_when_asked(tiny_onnx, tmp_path):
    engine = trtqat.build_engine(tiny_onnx, shapes="input:3x4", out=tmp_path / "e.engine")
    assert engine.backend == "ort" and engine.path == tmp_path / "e.engine"
    header = json.loads((tmp_path / "e.engine.json").read_text())
    assert header["build_options"]["shapes"] == {"input": [3, 4]}
    assert load_engine(engine.path).path == engine.path
    unsaved = trtqat.build_engine(tiny_onnx, "onnxruntime")
    assert unsaved.path is None and unsaved.backend == "ort"
    with pytest.raises(OptionsError, match="unknown backend 'nope'"):
        trtqat.build_engine(tiny_onnx, "nope")


def test_benchmark_returns_trtexecs_figures_and_their_spread(tiny_onnx, tmp_path):
    engine = trtqat.build_engine(tiny_onnx, out=tmp_path / "e.engine")
    result = trtqat.benchmark(engine.path, shapes={"input": (6, 4)}, percentiles=(50, 99),
                              **QUICK)
    assert isinstance(result, trtqat.BenchmarkResult) and len(result.queries) >= 20
    assert result.config["shapes"] == {"input": [6, 4]} and result.config["backend"] == "ort"
    assert result.throughput_qps > 0 and result.settings.warmup_ms == 0.0
    for stats in (result.latency, result.compute, result.enqueue):
        assert isinstance(stats, Stats) and set(stats.percentiles) == {50, 99}
        assert 0 < stats.min <= stats.median <= stats.max and math.isfinite(stats.cov)
    assert result.latency == result.stats("latency_ms")
    assert result.summary_lines()[1] == f"Throughput: {result.throughput_qps:g} qps"


def test_benchmark_runs_given_inputs_on_an_engine_or_a_runner(tiny_onnx):
    engine = trtqat.build_engine(tiny_onnx)
    x = np.ones((2, 4), np.float32)
    assert trtqat.benchmark(engine, inputs={"input": x}, **QUICK).config["shapes"] == {
        "input": [2, 4]}
    with engine.runner() as runner:
        result = trtqat.benchmark(runner, "input:5x4", **QUICK)
        assert runner.is_active  # the caller's runner stays the caller's
    assert result.config["shapes"] == {"input": [5, 4]}
    with pytest.raises(InputError, match="--shapes: unknown input 'x'"):
        trtqat.benchmark(engine, {"x": (1, 4)}, **QUICK)
    with pytest.raises(InputError, match="unknown input 'y'"):
        trtqat.benchmark(engine, inputs={"y": x}, **QUICK)
    with pytest.raises(OptionsError, match="--duration must be >= 0 s"):
        trtqat.benchmark(engine, duration=-1.0)
    with pytest.raises(OptionsError, match="warmup must be a number of seconds"):
        trtqat.benchmark(engine, warmup="long")


def test_the_engine_verbs_load_no_torch():
    code = ("import sys, trtqat\n"
            "trtqat.build_engine, trtqat.benchmark, trtqat.BenchmarkResult\n"
            "assert 'torch' not in sys.modules, 'torch loaded'\n"
            "assert trtqat.build_engine is __import__('trtqat.engines').engines.build_engine\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

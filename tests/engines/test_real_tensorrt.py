"""The TensorRT backend on a real GPU with real TensorRT (skipped elsewhere, with a reason)."""

from __future__ import annotations

import numpy as np
import pytest

from trtqat.engines import BenchmarkSettings, build_engine, load_engine

from .conftest import reference


def _real_gpu_reason() -> str | None:
    try:
        import tensorrt
    except Exception as exc:  # not installed, or the PyPI stub that fails on import
        return f"TensorRT is not installed ({type(exc).__name__})"
    if not hasattr(tensorrt, "Builder"):
        return "the installed tensorrt is a stub without the runtime libraries"
    try:
        from cuda.bindings import runtime
    except ImportError:
        return "cuda-python is not installed"
    err, count = runtime.cudaGetDeviceCount()
    if err != runtime.cudaError_t.cudaSuccess or count < 1:
        return "no CUDA device"
    return None


REASON = _real_gpu_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_real_build_run_and_graphs(dynamic_onnx, tmp_path) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", min_shapes={"x": (1, 3, 8, 8)},
                          opt_shapes={"x": (2, 3, 8, 8)}, max_shapes={"x": (4, 3, 8, 8)},
                          timing_cache=str(tmp_path / "timing.cache"))
    path = engine.save(tmp_path / "m.engine")
    feed = {"x": np.random.default_rng(0).standard_normal((3, 3, 8, 8), np.float32)}
    with load_engine(path).runner() as runner:
        np.testing.assert_allclose(runner.infer(feed)["y"], reference(dynamic_onnx, feed)["y"],
                                   rtol=1e-2, atol=1e-2)
        result = runner.benchmark(feed, BenchmarkSettings(warmup_ms=10, duration_s=0.2,
                                                          cuda_graph=True))
        assert result.queries and result.cuda_graph
        assert runner.profile_layers(feed, iterations=2)
    assert (tmp_path / "timing.cache").stat().st_size > 0

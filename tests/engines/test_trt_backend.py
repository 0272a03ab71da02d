"""TensorRT backend on the fake tensorrt (10 and 11 flavours) and fake cuda-python."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import types

import numpy as np
import pytest

from trtqat.engines import (
    BackendUnavailableError,
    BenchmarkSettings,
    CudaError,
    EngineBuildError,
    EngineFileError,
    ShapeError,
    build_engine,
    load_engine,
)
from trtqat.engines.cuda import load_cuda
from trtqat.engines.fileformat import sidecar_path, write_engine_files
from trtqat.engines.trt import TrtEngine

from .conftest import reference
from .fake_pycuda import make_driver
from .fake_tensorrt import make_module

PROFILE = {"min_shapes": {"x": (1, 3, 8, 8)}, "opt_shapes": {"x": (2, 3, 8, 8)},
           "max_shapes": {"x": (4, 3, 8, 8)}}
FAST = BenchmarkSettings(warmup_ms=0, duration_s=0, iterations=5)


def calls(trt) -> list[str]:
    return [name for name, _ in trt._calls]


def args_of(trt, name: str) -> list[tuple]:
    return [args for n, args in trt._calls if n == name]


def x_of(batch: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(batch).standard_normal((batch, 3, 8, 8), np.float32)}


def test_build_call_order_and_arguments(fake_trt, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", memory_pools={"workspace": 1 << 28},
                          builder_optimization_level=4, **PROFILE)
    order = calls(fake_trt)
    expected = ["Builder", "Builder.create_network", "OnnxParser", "OnnxParser.parse",
                "Builder.create_builder_config", "IBuilderConfig.set_memory_pool_limit",
                "IBuilderConfig.builder_optimization_level", "Builder.create_optimization_profile",
                "IOptimizationProfile.set_shape", "IBuilderConfig.add_optimization_profile",
                "Builder.build_serialized_network", "Runtime", "Runtime.deserialize_cuda_engine"]
    assert [c for c in order if c in expected] == expected
    assert args_of(fake_trt, "Builder.create_network") == [(0,)]
    assert args_of(fake_trt, "IBuilderConfig.set_memory_pool_limit") == [("WORKSPACE", 1 << 28)]
    assert args_of(fake_trt, "IOptimizationProfile.set_shape") == [
        ("x", (1, 3, 8, 8), (2, 3, 8, 8), (4, 3, 8, 8))]
    assert args_of(fake_trt, "OnnxParser.parse") == [(str(dynamic_onnx),)]
    spec = engine.inputs[0]
    assert (spec.shape, spec.min_shape, spec.max_shape) == ((None, 3, 8, 8), (1, 3, 8, 8),
                                                            (4, 3, 8, 8))
    assert engine.header["backend_version"] == fake_trt.__version__


def test_network_flags_never_hard_code_strongly_typed(fake_trt, dynamic_onnx) -> None:
    build_engine(dynamic_onnx, "tensorrt", strongly_typed=True, **PROFILE)
    (flags,) = args_of(fake_trt, "Builder.create_network")[0]
    if fake_trt._major >= 11:
        assert flags == 0  # always strongly typed; the flag is ignored
    else:
        assert flags == 1 << int(fake_trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def test_precision_flags_only_where_tensorrt_has_them(fake_trt, dynamic_onnx, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="trtqat"):
        build_engine(dynamic_onnx, "tensorrt", best=True, **PROFILE)
    flags = [args[0] for args in args_of(fake_trt, "IBuilderConfig.set_flag")]
    if fake_trt._major >= 11:
        assert flags == []
        assert "takes precision from the ONNX graph" in caplog.text
        assert "trtqat export --variant int8-fp16" in caplog.text
    else:
        assert flags == ["FP16", "INT8"] and "trtqat export" not in caplog.text


def test_dynamic_input_without_shapes_uses_one(fake_trt, dynamic_onnx, caplog) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt")
    assert engine.inputs[0].min_shape == engine.inputs[0].max_shape == (1, 3, 8, 8)
    assert "has no shapes: using 1x3x8x8" in caplog.text


def test_every_parser_error_is_reported(fake_trt, dynamic_onnx) -> None:
    fake_trt._fail["parse"] = ["Unsupported op Foo", "bad attr on Bar", "third problem"]
    with pytest.raises(EngineBuildError) as info:
        build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    message = str(info.value)
    assert "(3 error(s))" in message and "\n" not in message
    for text in fake_trt._fail["parse"]:
        assert text in message
    assert "Builder.build_serialized_network" not in calls(fake_trt)


def test_build_failure_is_an_error(fake_trt, dynamic_onnx) -> None:
    fake_trt._fail["build"] = True
    with pytest.raises(EngineBuildError, match="TensorRT could not build an engine"):
        build_engine(dynamic_onnx, "tensorrt", **PROFILE)


def test_timing_cache_is_read_and_saved(fake_trt, dynamic_onnx, tmp_path, caplog) -> None:
    cache = tmp_path / "cache" / "timing.cache"
    build_engine(dynamic_onnx, "tensorrt", timing_cache=str(cache), **PROFILE)
    first = cache.read_bytes()
    assert args_of(fake_trt, "IBuilderConfig.create_timing_cache") == [(0,)]
    order = calls(fake_trt)
    assert order.index("IBuilderConfig.set_timing_cache") < order.index(
        "Builder.build_serialized_network") < order.index("ITimingCache.serialize")
    fake_trt._calls.clear()
    build_engine(dynamic_onnx, "tensorrt", timing_cache=str(cache), **PROFILE)
    assert args_of(fake_trt, "IBuilderConfig.create_timing_cache") == [(len(first),)]
    assert cache.read_bytes() != first  # grew with the second build
    cache.write_bytes(b"garbage")
    build_engine(dynamic_onnx, "tensorrt", timing_cache=str(cache), **PROFILE)
    assert "does not match" in caplog.text


def test_infer_matches_onnx_runtime(fake_trt, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner() as runner:
        for batch in (1, 4, 2):  # shapes change: buffers grow, addresses rebound
            feed = x_of(batch)
            out = runner.infer(feed)
            np.testing.assert_allclose(out["y"], reference(dynamic_onnx, feed)["y"], rtol=1e-5,
                                       atol=1e-5)
        with pytest.raises(ShapeError, match="outside the engine's profile"):
            runner.infer(x_of(5))


def test_runner_frees_everything(fake_trt, fake_cuda, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner() as runner:
        runner.infer(x_of(2))
        runner.benchmark(x_of(2), FAST)
    state = fake_cuda._STATE
    assert not (state.device_mem or state.host_mem or state.streams or state.events
                or state.graphs or state.execs)
    assert state.calls.count("cudaStreamCreate") == 1


def test_saved_plan_is_exactly_the_host_memory_bytes(fake_trt, dynamic_onnx, tmp_path,
                                                     monkeypatch) -> None:
    returned = []
    build = fake_trt.Builder.build_serialized_network

    def spy(self, network, config):
        plan = build(self, network, config)
        returned.append(plan)
        return plan

    monkeypatch.setattr(fake_trt.Builder, "build_serialized_network", spy)
    path = build_engine(dynamic_onnx, "tensorrt", **PROFILE).save(tmp_path / "m.engine")
    assert isinstance(returned[0], fake_trt.IHostMemory)
    assert path.read_bytes() == bytes(returned[0])  # a plain plan: nothing prepended
    meta = json.loads(sidecar_path(path).read_text())
    assert meta["backend"] == "tensorrt" and meta["backend_version"] == fake_trt.__version__
    assert meta["source_sha256"] == hashlib.sha256(dynamic_onnx.read_bytes()).hexdigest()
    assert meta["build_options"]["max_shapes"] == {"x": [4, 3, 8, 8]}


def test_save_load_and_refusals(fake_trt, dynamic_onnx, tmp_path, monkeypatch) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    path = engine.save(tmp_path / "m.engine")
    loaded = load_engine(path)
    assert isinstance(loaded, TrtEngine) and loaded.inputs == engine.inputs
    with loaded.runner() as runner:
        feed = x_of(3)
        np.testing.assert_allclose(runner.infer(feed)["y"],
                                   reference(dynamic_onnx, feed)["y"], rtol=1e-5, atol=1e-5)
    with pytest.raises(EngineFileError, match="is a 'tensorrt' engine, not 'ort'; run it with "
                                              "--backend=tensorrt"):
        load_engine(path, backend="ort")
    # a plain plan without a sidecar (as trtexec --saveEngine writes it): found from content
    raw = tmp_path / "raw.plan"
    raw.write_bytes(path.read_bytes())
    for plain in (load_engine(raw), load_engine(raw, backend="tensorrt")):
        assert isinstance(plain, TrtEngine) and plain.inputs[0].max_shape == (4, 3, 8, 8)
    with pytest.raises(EngineFileError, match="ONNX model, not a TensorRT plan"):
        load_engine(dynamic_onnx, backend="tensorrt")
    (tmp_path / "junk.plan").write_bytes(b"\x01\x02junk")
    with pytest.raises(EngineFileError, match="neither an ONNX model nor a TensorRT"):
        load_engine(tmp_path / "junk.plan")
    # another TensorRT version: refused from the sidecar, before TensorRT sees the plan
    other = "11.4.0.106" if fake_trt._major == 10 else "10.16.0.72"
    monkeypatch.setitem(sys.modules, "tensorrt", make_module(other))
    with pytest.raises(EngineFileError, match=f"built with TensorRT {fake_trt.__version__}, "
                                              f"this is {other}.*rebuild"):
        load_engine(path)
    header = json.loads(sidecar_path(path).read_text())
    forged = write_engine_files(tmp_path / "forged.engine", dict(header, backend_version=other),
                                path.read_bytes())
    with pytest.raises(EngineFileError, match="could not deserialize"):
        with load_engine(forged).runner():
            pass
    # without TensorRT, a plan without sidecar says what it needs
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailableError, match="reading it as a TensorRT plan needs "
                                                      "TensorRT: pip install"):
        load_engine(raw)


def test_benchmark_defaults_follow_trtexec_of_each_version(fake_trt, fake_cuda,
                                                           dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner() as runner:
        result = runner.benchmark(x_of(2), FAST)
        if fake_trt._major >= 11:
            assert result.cuda_graph and not result.data_transfers
            assert fake_cuda._STATE.launches >= len(result.queries)
        else:
            assert not result.cuda_graph and result.data_transfers
            assert fake_cuda._STATE.launches == 0
        assert len(result.summary_lines()) >= 9
        for q in result.queries:
            assert q.h2d_start <= q.h2d_end <= q.compute_start <= q.compute_end <= q.d2h_end
        explicit = runner.benchmark(x_of(2), BenchmarkSettings(
            warmup_ms=0, duration_s=0, iterations=3, cuda_graph=True, data_transfers=True))
        assert explicit.cuda_graph and explicit.data_transfers


def test_graph_capture_order(fake_trt, fake_cuda, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner() as runner:
        runner.benchmark(x_of(2), BenchmarkSettings(warmup_ms=0, duration_s=0, iterations=2,
                                                    cuda_graph=True))
    seq = [c for c in fake_cuda._STATE.calls if c in (
        "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
        "cudaGraphLaunch", "cudaStreamSynchronize")]
    begin = seq.index("cudaStreamBeginCapture")
    assert seq[begin - 1] == "cudaStreamSynchronize"  # the run outside capture finished first
    assert seq[begin:begin + 3] == ["cudaStreamBeginCapture", "cudaStreamEndCapture",
                                    "cudaGraphInstantiate"]
    assert "cudaGraphLaunch" in seq[begin + 3:]
    executes = [i for i, c in enumerate(calls(fake_trt)) if c.endswith("execute_async_v3")]
    assert len(executes) >= 2  # once outside capture, once captured


@pytest.mark.parametrize("failure", ["invalidate", "cudaStreamBeginCapture",
                                     "cudaGraphInstantiate", "cudaStreamEndCapture"])
def test_graph_capture_failure_falls_back(fake_trt, fake_cuda, dynamic_onnx, caplog,
                                          failure: str) -> None:
    state = fake_cuda._STATE
    if failure == "invalidate":
        state.invalidate_capture = True
    else:
        state.fail[failure] = fake_cuda.cudaError_t.cudaErrorStreamCaptureUnsupported
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    feed = x_of(2)
    with engine.runner() as runner:
        result = runner.benchmark(feed, BenchmarkSettings(warmup_ms=0, duration_s=0,
                                                          iterations=3, cuda_graph=True))
        assert not result.cuda_graph and len(result.queries) >= 3
        assert state.launches == 0
        np.testing.assert_allclose(runner.infer(feed)["y"], reference(dynamic_onnx, feed)["y"],
                                   rtol=1e-5, atol=1e-5)
    assert "CUDA graph capture failed" in caplog.text and "plain enqueue" in caplog.text
    assert not state.graphs and not state.execs  # nothing leaked
    assert not any(s.capturing for s in state.streams.values())


def test_layer_profile_uses_a_separate_context(fake_trt, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    with engine.runner() as runner:
        layers = runner.profile_layers(x_of(2), iterations=3)
    assert set(layers) == {"conv", "relu"}
    assert calls(fake_trt).count("ICudaEngine.create_execution_context") == 2


def test_no_gpu_and_missing_libraries(fake_trt, fake_cuda, dynamic_onnx, monkeypatch) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    fake_cuda._STATE.devices = 0
    with pytest.raises(CudaError, match="no CUDA device found.*--backend=ort"):
        with engine.runner():
            pass
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", None)
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(BackendUnavailableError, match="pip install 'trtqat\\[tensorrt\\]'"):
        load_cuda()
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailableError, match="TensorRT is not installed; pip install "
                                                      "'trtqat\\[tensorrt\\]'"):
        build_engine(dynamic_onnx, "tensorrt")


def test_execution_context_failure(fake_trt, dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    fake_trt._fail["context"] = True
    with pytest.raises(CudaError, match="could not create an execution context"):
        engine.runner().activate()


def test_trtqat_exec_with_tensorrt_backend(fake_trt, dynamic_onnx, tmp_path, capsys) -> None:
    from trtqat.cli.exec_cmd import main

    engine = tmp_path / "m.engine"
    rc = main([f"--onnx={dynamic_onnx}", "--backend=tensorrt", "--minShapes=x:1x3x8x8",
               "--optShapes=x:2x3x8x8", "--maxShapes=x:4x3x8x8", f"--saveEngine={engine}",
               "--warmUp=0", "--duration=0", "--iterations=3", "--int8",
               "--memPoolSize=workspace:64", "--builderOptimizationLevel=2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "=== Performance summary ===" in out
    graph_on = fake_trt._major >= 11
    assert f"CUDA graph {'on' if graph_on else 'off'}" in out
    assert ("trtqat export --variant int8" in err) == graph_on
    rc = main([f"--loadEngine={engine}", "--backend=tensorrt", "--shapes=x:8x3x8x8"])
    assert rc == 1
    assert "outside the engine's profile" in capsys.readouterr().err


def test_pycuda_fallback_runs_and_skips_graphs(fake_trt, dynamic_onnx, monkeypatch,
                                               caplog) -> None:
    driver = make_driver()
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", None)  # no cuda-python
    monkeypatch.setitem(sys.modules, "pycuda", types.ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    engine = build_engine(dynamic_onnx, "tensorrt", **PROFILE)
    feed = x_of(2)
    with engine.runner() as runner:
        assert runner.cuda.name == "pycuda"
        np.testing.assert_allclose(runner.infer(feed)["y"], reference(dynamic_onnx, feed)["y"],
                                   rtol=1e-5, atol=1e-5)
        result = runner.benchmark(feed, BenchmarkSettings(warmup_ms=0, duration_s=0,
                                                          iterations=3, cuda_graph=True))
    assert not result.cuda_graph and "using plain enqueue" in caplog.text
    assert driver._log[:2] == ["init", "push"] and driver._log[-1] == "pop"

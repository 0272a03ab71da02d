"""ONNX Runtime backend: build, save, load, refuse, check inputs, run, time, prepare hook."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import onnxruntime
import pytest

from trtqat.engines import (
    BenchmarkSettings,
    BuildOptions,
    EngineBuildError,
    EngineFileError,
    InputError,
    ModelFileError,
    ShapeError,
    build_engine,
    load_engine,
    random_feed,
)
from trtqat.engines import ort as ort_backend
from trtqat.engines.errors import RunnerStateError
from trtqat.engines.fileformat import sidecar_path, write_container_file, write_engine_files
from trtqat.engines.ort import OrtEngine

from .conftest import make_conv_model, reference

FAST = BenchmarkSettings(warmup_ms=0, duration_s=0, iterations=5)


def x_of(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 3, 8, 8), np.float32)}


def test_build_save_load_infer(dynamic_onnx, tmp_path) -> None:
    engine = build_engine(dynamic_onnx, "ort")
    assert engine.inputs[0].shape == (None, 3, 8, 8) and not engine.inputs[0].has_profile
    path = engine.save(tmp_path / "engines" / "m.engine")
    header, payload = json.loads(sidecar_path(path).read_text()), path.read_bytes()
    assert payload == engine.payload and header["payload_size"] == len(payload)
    assert header["source_sha256"] == hashlib.sha256(dynamic_onnx.read_bytes()).hexdigest()
    assert header["backend"] == "ort" and header["backend_version"] == onnxruntime.__version__
    assert header["providers"] == ["CPUExecutionProvider"] and header["optimized"] is True
    assert header["inputs"][0]["name"] == "x" and header["build_options"]["providers"] == ["cpu"]
    assert onnx.load_from_string(payload).graph.node  # the optimised model itself
    loaded = load_engine(path)
    assert isinstance(loaded, OrtEngine) and loaded.inputs == engine.inputs
    for batch in (1, 3):
        feed = x_of(batch)
        with loaded.runner(threads=1) as runner:
            out = runner.infer(feed)
        np.testing.assert_allclose(out["y"], reference(dynamic_onnx, feed)["y"], rtol=1e-4,
                                   atol=1e-5)


def test_unused_initializer_warnings_are_silenced(tmp_path, capfd) -> None:
    path = make_conv_model(tmp_path / "u.onnx", unused_initializer=True)
    with build_engine(path, "ort").runner() as runner:
        runner.infer(x_of(1))
    assert "unused_weight" not in capfd.readouterr().err


def test_refuses_other_backend_version_and_loads_plain_onnx(dynamic_onnx, tmp_path,
                                                            caplog) -> None:
    engine = build_engine(dynamic_onnx, "ort")
    other = write_engine_files(tmp_path / "trt.engine", dict(engine.header, backend="tensorrt"),
                               engine.payload)
    with pytest.raises(EngineFileError, match="is a 'tensorrt' engine, not 'ort'; run it with "
                                              "--backend=tensorrt"):
        OrtEngine.load(other)
    newer = write_engine_files(tmp_path / "v2.engine",
                               dict(engine.header, backend_version="2.0.1"), engine.payload)
    with pytest.raises(EngineFileError, match="built with onnxruntime 2.0.1.*rebuild it"):
        load_engine(newer)
    # a plain ONNX model without a sidecar is an ORT engine (CPU provider)
    for loaded in (load_engine(dynamic_onnx), load_engine(dynamic_onnx, backend="ort")):
        assert isinstance(loaded, OrtEngine) and loaded.inputs[0].shape == (None, 3, 8, 8)
        assert loaded.header["sidecar"] is False
    # a sidecar that does not match its engine (e.g. overwritten by another tool)
    saved = engine.save(tmp_path / "m.onnx")
    saved.write_bytes(dynamic_onnx.read_bytes())
    with pytest.raises(EngineFileError, match="does not match its sidecar m.onnx.json"):
        load_engine(saved)
    sidecar_path(saved).write_text("{not json")  # another tool's file: warned and ignored
    with caplog.at_level("WARNING", "trtqat"):
        assert load_engine(saved).header["sidecar"] is False
    assert "m.onnx.json is not a trtqat engine sidecar" in caplog.text
    with pytest.raises(EngineFileError, match="is a JSON file, not an engine"):
        load_engine(sidecar_path(saved))
    (tmp_path / "junk.bin").write_bytes(b"\x01\x02junk")
    with pytest.raises(EngineFileError, match="is not an ONNX model; if it is a TensorRT plan"):
        load_engine(tmp_path / "junk.bin", backend="ort")
    # binary data that happens to open with "{" (1 random file in 256) is no JSON file
    (tmp_path / "brace.bin").write_bytes(b"{" + bytes(range(256)))
    with pytest.raises(EngineFileError, match="is not an ONNX model; if it is a TensorRT plan"):
        load_engine(tmp_path / "brace.bin", backend="ort")


def test_old_container_files_load_with_a_deprecation_note(dynamic_onnx, tmp_path,
                                                         caplog) -> None:
    engine = build_engine(dynamic_onnx, "ort")
    old = write_container_file(tmp_path / "old.engine", engine.header, engine.payload)
    with caplog.at_level("WARNING", "trtqat"):
        loaded = load_engine(old)
    assert isinstance(loaded, OrtEngine) and loaded.payload == engine.payload
    assert "old container layout (deprecated" in caplog.text
    data = old.read_bytes()
    (tmp_path / "trunc.engine").write_bytes(data[:-5])
    with pytest.raises(EngineFileError, match="truncated"):
        load_engine(tmp_path / "trunc.engine")
    (tmp_path / "flip.engine").write_bytes(data[:-1] + b"X")
    with pytest.raises(EngineFileError, match="corrupted"):
        load_engine(tmp_path / "flip.engine")


def test_bad_onnx_files(tmp_path, dynamic_onnx) -> None:
    (tmp_path / "trunc.onnx").write_bytes(dynamic_onnx.read_bytes()[:150])
    (tmp_path / "text.onnx").write_text("not a model\n")
    (tmp_path / "empty.onnx").write_bytes(b"")
    for name, needle in (("missing.onnx", "does not exist"), ("trunc.onnx", "not an ONNX model"),
                         ("text.onnx", "not an ONNX model"), ("empty.onnx", "is empty")):
        with pytest.raises(ModelFileError, match=needle):
            build_engine(tmp_path / name, "ort")


def test_input_checks_name_the_input_and_the_fix(dynamic_onnx, static_onnx) -> None:
    engine = build_engine(dynamic_onnx, "ort", min_shapes={"x": (1, 3, 8, 8)},
                          opt_shapes={"x": (2, 3, 8, 8)}, max_shapes={"x": (4, 3, 8, 8)})
    with engine.runner() as runner:
        cases = [
            ({"x": x_of(1)["x"], "z": 1}, InputError, "unknown input 'z'; the engine's inputs "
                                                     "are: x"),
            ({}, InputError, "input 'x' is missing; the engine needs x \\(float32 \\?x3x8x8"),
            ({"x": x_of(1)["x"].astype(np.float64)}, InputError,
             "input 'x' is float64, the engine expects float32; convert it with "
             "\\.astype\\(np\\.float32\\)"),
            ({"x": np.zeros((1, 3, 8), np.float32)}, InputError, "rank 3"),
            ({"x": np.zeros((1, 2, 8, 8), np.float32)}, ShapeError, "dimension 1 is fixed to 3"),
            ({"x": x_of(8)["x"]}, ShapeError,
             "outside the engine's profile \\(min 1x3x8x8, max 4x3x8x8\\); rebuild with "
             "--minShapes/--maxShapes"),
            ([1, 2], InputError, "feed must be a dict"),
        ]
        for feed, error, needle in cases:
            with pytest.raises(error, match=needle):
                runner.infer(feed)
    with build_engine(static_onnx, "ort").runner() as runner:
        with pytest.raises(ShapeError, match="dimension 0 is fixed to 1 in this engine; "
                                             "re-export the ONNX with a dynamic batch axis"):
            runner.infer(x_of(2))


def test_batch_the_onnx_does_not_allow_fails_at_build(static_onnx) -> None:
    with pytest.raises(ShapeError, match="the batch dimension \\(0\\) is fixed to 1 in the model"):
        build_engine(static_onnx, "ort", shapes={"x": (4, 3, 8, 8)})


def test_runner_lifecycle(dynamic_onnx) -> None:
    runner = build_engine(dynamic_onnx, "ort").runner()
    with pytest.raises(RunnerStateError, match="not active"):
        runner.infer(x_of(1))
    runner.activate()
    with pytest.raises(RunnerStateError, match="already active"):
        runner.activate()
    runner.deactivate()
    runner.deactivate()  # idempotent
    assert not runner.is_active


def test_benchmark_and_profile(dynamic_onnx) -> None:
    engine = build_engine(dynamic_onnx, "ort", shapes={"x": (2, 3, 8, 8)})
    feed = random_feed(engine.inputs)
    assert feed["x"].shape == (2, 3, 8, 8)
    with engine.runner() as runner:
        result = runner.benchmark(feed, FAST)
        assert len(result.queries) >= 5 and result.data_transfers and not result.cuda_graph
        for q in result.queries:
            assert q.h2d_start <= q.h2d_end <= q.compute_start <= q.compute_end <= q.d2h_end
            assert (q.enq_start, q.enq_end) == (q.compute_start, q.compute_end)
        no_copy = runner.benchmark(feed, BenchmarkSettings(warmup_ms=0, duration_s=0,
                                                           iterations=3, data_transfers=False))
        assert all(q.h2d_ms < 1.0 for q in no_copy.queries) and not no_copy.data_transfers
        layers = runner.profile_layers(feed, iterations=2)
        assert layers and all(ms >= 0 for ms in layers.values())
        assert any("Conv" in name for name in layers)
        # the runner still infers correctly after timing (buffers torn down)
        np.testing.assert_allclose(runner.infer(feed)["y"], reference(dynamic_onnx, feed)["y"],
                                   rtol=1e-4, atol=1e-5)
    assert json.dumps(result.to_dict())  # JSON-safe for reports


def test_prepare_model_hook(dynamic_onnx, monkeypatch) -> None:
    seen = []

    def add_metadata(model: onnx.ModelProto, options: BuildOptions) -> onnx.ModelProto:
        seen.append(options.ort_prepare)
        onnx.helper.set_model_props(model, {"prepared": "yes"})
        return model

    monkeypatch.setitem(ort_backend.PREPARE_STEPS, "test-step", add_metadata)
    engine = build_engine(dynamic_onnx, "ort", ort_prepare="test-step")
    assert seen == ["test-step"] and engine.header["prepare"] == "test-step"
    monkeypatch.setitem(ort_backend.PREPARE_STEPS, "ghost", "trtqat.engines.no_such_step:prepare")
    with pytest.raises(EngineBuildError, match="needs trtqat.engines.no_such_step"):
        build_engine(dynamic_onnx, "ort", ort_prepare="ghost")
    with pytest.raises(EngineBuildError, match="unknown ORT prepare step 'nope'"):
        build_engine(dynamic_onnx, "ort", ort_prepare="nope")
    assert "qdq" in ort_backend.PREPARE_STEPS  # where trtqat.engines.ort_qdq plugs in


def test_precision_flags_are_explained_not_applied(dynamic_onnx, caplog) -> None:
    build_engine(dynamic_onnx, "ort", int8=True)
    assert "export the model with 'trtqat export --variant int8'" in caplog.text


def test_unavailable_provider_is_a_user_error(dynamic_onnx) -> None:
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(Exception, match="CUDAExecutionProvider is not available.*"
                                        "onnxruntime-gpu"):
        build_engine(dynamic_onnx, "ort", providers=("cuda",))


def test_refuses_engine_optimised_on_another_machine(dynamic_onnx, tmp_path) -> None:
    engine = build_engine(dynamic_onnx, "ort")
    path = write_engine_files(tmp_path / "arm.engine", dict(engine.header, machine="sparc64"),
                             engine.payload)
    with pytest.raises(EngineFileError, match="optimised on sparc64"):
        load_engine(path)


def test_gpu_providers_get_the_device_id() -> None:
    class FakeOrt:
        @staticmethod
        def get_available_providers() -> list[str]:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    providers = ort_backend._providers(FakeOrt, BuildOptions(providers=("cuda",)), device=1)
    assert providers == [("CUDAExecutionProvider", {"device_id": "1"}),
                         ("CPUExecutionProvider", {})]

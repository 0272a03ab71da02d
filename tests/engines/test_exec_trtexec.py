"""``trtqat-exec`` against trtexec's flags: shapes, input/output/profile/layer files, backend
notes, summary labels, and the TensorRT run options on the fakes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trtqat.engines import load_engine

from .conftest import reference
from .test_cli import FAST, run_exec

PROFILE = ["--minShapes=x:1x3x8x8", "--optShapes=x:2x3x8x8", "--maxShapes=x:4x3x8x8"]


def test_shapes_with_min_opt_max_builds_the_profile_and_runs_shapes(capsys, dynamic_onnx,
                                                                    tmp_path) -> None:
    engine = tmp_path / "m.onnx"
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", *PROFILE, "--shapes=x:3x3x8x8",
                            f"--saveEngine={engine}", *FAST)
    assert rc == 0, err
    assert "Input x: float32 3x3x8x8" in out
    spec = load_engine(engine).inputs[0]
    assert (spec.min_shape, spec.opt_shape, spec.max_shape) == ((1, 3, 8, 8), (2, 3, 8, 8),
                                                                (4, 3, 8, 8))
    summary = out[out.index("=== Performance summary ==="):]
    assert any(line.startswith("CPU Compute Time: ") for line in summary)
    assert not any("GPU" in line for line in summary)  # ORT on the CPU: no GPU labels


@pytest.mark.parametrize("kind", ["raw", "npy", "npz"])
def test_load_inputs_and_export_output(capsys, dynamic_onnx, tmp_path, kind: str) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8), np.float32)
    path = tmp_path / {"raw": "x.bin", "npy": "x.npy", "npz": "x.npz"}[kind]
    {"raw": lambda: x.tofile(path), "npy": lambda: np.save(path, x),
     "npz": lambda: np.savez(path, x=x)}[kind]()
    shapes = ["--shapes=x:2x3x8x8"] if kind == "raw" else []  # raw bytes need the run shape
    out_json = tmp_path / "out.json"
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", f"--loadInputs=x:{path}", *shapes,
                            f"--exportOutput={out_json}", *FAST)
    assert rc == 0, err
    (record,) = json.loads(out_json.read_text())
    assert record["name"] == "y" and record["dimensions"] == "2x4x8x8"
    np.testing.assert_allclose(np.array(record["values"], np.float32).reshape(2, 4, 8, 8),
                               reference(dynamic_onnx, {"x": x})["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("argv, needle", [
    (["--loadInputs=x:{bin}"], "--loadInputs: {bin} has 100 bytes, input 'x' (float32 "
                               "1x3x8x8) needs 768; give --shapes"),
    (["--loadInputs=q:{bin}"], "--loadInputs: unknown input 'q'"),
    (["--loadInputs=x:{missing}"], "--loadInputs: file {missing} for input 'x' does not exist"),
    (["--loadInputs=x"], "--loadInputs: 'x' is not name:file"),
    (["--loadInputs=x:{npy}", "--shapes=x:1x3x8x8"], "holds 2x3x8x8 for input 'x', but "
                                                     "--shapes asks for 1x3x8x8"),
    (["--infStreams=0"], "--infStreams must be >= 1"),
    (["--device=-1"], "--device must be >= 0"),
    (["--profilingVerbosity=loud"], "--profilingVerbosity must be one of layer_names_only"),
])
def test_bad_trtexec_flags_are_one_line(capsys, dynamic_onnx, tmp_path, argv, needle) -> None:
    names = {"bin": tmp_path / "x.bin", "missing": tmp_path / "none.bin",
             "npy": tmp_path / "x.npy"}
    names["bin"].write_bytes(b"\0" * 100)
    np.save(names["npy"], np.zeros((2, 3, 8, 8), np.float32))
    rc, _, err = run_exec(capsys, f"--onnx={dynamic_onnx}", *FAST,
                          *[a.format(**names) for a in argv])
    assert rc == 1 and len(err) == 1, err
    assert needle.format(**names) in err[0]


@pytest.mark.parametrize("spec", ["q:{bin}", "x:{missing}", "x"])
def test_bad_load_inputs_fail_before_the_build(capsys, dynamic_onnx, tmp_path, monkeypatch,
                                              spec: str) -> None:
    from trtqat.engines import registry

    def no_build(backend):
        raise AssertionError("the engine was built before --loadInputs was checked")

    monkeypatch.setattr(registry, "builder_class", no_build)
    import trtqat.engines as engines

    monkeypatch.setattr(engines, "builder_class", no_build)
    names = {"bin": tmp_path / "x.bin", "missing": tmp_path / "none.bin"}
    names["bin"].write_bytes(b"\0" * 768)
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", *FAST,
                            f"--loadInputs={spec.format(**names)}")
    assert rc == 1 and len(err) == 1 and "error: --loadInputs" in err[0], err
    assert "Engine built" not in out


def test_profile_and_layer_info_in_trtexec_json(capsys, dynamic_onnx, tmp_path) -> None:
    profile, layers = tmp_path / "profile.json", tmp_path / "layers.json"
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", "--profilingVerbosity=detailed",
                            "--dumpLayerInfo", f"--exportLayerInfo={layers}",
                            f"--exportProfile={profile}", "--ortPrepare=none", *FAST)
    assert rc == 0, err
    records = json.loads(profile.read_text())
    assert records[0] == {"count": 5}
    assert records[1:] and all(set(r) == {"name", "timeMs", "averageMs", "percentage"}
                               for r in records[1:])
    assert sum(r["percentage"] for r in records[1:]) == pytest.approx(100.0)
    info = json.loads(layers.read_text())
    assert info["Bindings"] == ["x", "y"]
    assert {"Name", "LayerType", "Inputs", "Outputs"} <= set(info["Layers"][0])
    assert "=== Layer Information ===" in out and "Bindings: x, y" in out
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", f"--exportLayerInfo={layers}",
                            "--skipInference")
    assert rc == 0 and all(isinstance(n, str) for n in json.loads(layers.read_text())["Layers"])


def test_flags_ort_ignores_are_warned(capsys, dynamic_onnx, tmp_path) -> None:
    rc, _, err = run_exec(capsys, f"--onnx={dynamic_onnx}", f"--timingCacheFile={tmp_path}/c",
                          "--memPoolSize=workspace:64", "--builderOptimizationLevel=1",
                          "--useSpinWait", "--infStreams=2", "--device=1", *FAST)
    assert rc == 0, err
    for flag in ("--timingCacheFile is ignored", "--memPoolSize is ignored",
                 "--builderOptimizationLevel is a TensorRT builder setting",
                 "--useSpinWait is ignored", "--infStreams is ignored", "--device is ignored"):
        assert any(line.startswith("[W] " + flag) for line in err), (flag, err)
    engine = tmp_path / "m.onnx"
    assert run_exec(capsys, f"--onnx={dynamic_onnx}", f"--saveEngine={engine}",
                    "--skipInference")[0] == 0
    rc, _, err = run_exec(capsys, f"--loadEngine={engine}", "--fp16", "--skipInference")
    assert rc == 0 and any("--fp16 is a build option" in line for line in err)


def test_tensorrt_run_flags(fake_trt, fake_cuda, capsys, dynamic_onnx, tmp_path) -> None:
    layers = tmp_path / "layers.json"
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", "--backend=tensorrt", *PROFILE,
                            "--shapes=x:3x3x8x8", "--useSpinWait", "--infStreams=2",
                            "--device=0", "--threads=2",
                            "--profilingVerbosity=verbose",  # trtexec's old name of detailed
                            f"--exportLayerInfo={layers}", *FAST)
    assert rc == 0, err
    assert "Input x: float32 3x3x8x8" in out
    assert any(line.startswith("GPU Compute Time: ") for line in out)
    assert "cudaEventQuery" in fake_cuda._STATE.calls and "cudaSetDevice" in fake_cuda._STATE.calls
    assert any(line.startswith("[W] --threads is an ONNX Runtime option") for line in err)
    info = json.loads(layers.read_text())
    assert info["Bindings"] == ["x", "y"] and info["Layers"][0]["LayerType"] == "Conv"


def test_old_container_is_re_saved_as_a_plain_engine(capsys, dynamic_onnx, tmp_path) -> None:
    from trtqat.engines import build_engine
    from trtqat.engines.fileformat import sidecar_path, write_container_file

    engine = build_engine(dynamic_onnx, "ort")
    old = write_container_file(tmp_path / "old.engine", engine.header, engine.payload)
    new = tmp_path / "new.onnx"
    rc, out, err = run_exec(capsys, f"--loadEngine={old}", f"--saveEngine={new}",
                            "--skipInference")
    assert rc == 0 and any("old container layout (deprecated" in line for line in err)
    assert new.read_bytes() == engine.payload  # the optimised ONNX itself
    meta = json.loads(sidecar_path(new).read_text())
    assert meta["backend"] == "ort" and meta["payload_size"] == len(engine.payload)
    assert "Engine saved to" in out[-1] and "new.onnx.json" in out[-1]
    # the plain engine loads without warnings, and without its sidecar too
    rc, _, err = run_exec(capsys, f"--loadEngine={new}", *FAST)
    assert rc == 0 and not err
    sidecar_path(new).unlink()
    rc, out, err = run_exec(capsys, f"--loadEngine={new}", *FAST)
    assert rc == 0 and any(line.startswith("CPU Compute Time") for line in out)


def test_common_trtexec_flags_parse_and_are_named(capsys, dynamic_onnx, tmp_path) -> None:
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", "--noTF32", "--sparsity=disable",
                            "--inputIOFormats=fp32:chw", "--dumpOutput", "--threads",
                            "--explicitBatch", "--avgTiming=4", *FAST)
    assert rc == 0, err
    for flag in ("noTF32", "sparsity", "inputIOFormats", "dumpOutput", "explicitBatch",
                 "avgTiming"):
        assert f"[W] --{flag} is not supported by trtqat-exec; ignored" in err, (flag, err)
    assert any(line.startswith("Throughput: ") for line in out)


def test_old_trtexec_spellings_map_to_current_flags(capsys, dynamic_onnx, tmp_path) -> None:
    engine = tmp_path / "m.onnx"
    rc, out, err = run_exec(capsys, f"--onnx={dynamic_onnx}", "--workspace=64", "--streams=2",
                            "--buildOnly", f"--saveEngine={engine}")
    assert rc == 0, err
    assert not any(line.startswith("Throughput") for line in out)  # --buildOnly: no inference
    assert any(line.startswith("[W] --memPoolSize is ignored") for line in err)
    assert any(line.startswith("[W] --infStreams is ignored") for line in err)
    assert load_engine(engine).build_options.memory_pools == {"workspace": 64 << 20}
    rc, _, err = run_exec(capsys, f"--onnx={dynamic_onnx}", "--streams=0", *FAST)
    assert rc == 1 and err == ["trtqat-exec: error: --infStreams must be >= 1, got 0"]


def test_loaded_engine_logs_at_this_commands_verbosity(capfd, dynamic_onnx, tmp_path) -> None:
    from trtqat.cli.exec_cmd import main

    engine = tmp_path / "m.onnx"
    assert main([f"--onnx={dynamic_onnx}", f"--saveEngine={engine}", "--verbose",
                 "--skipInference"]) == 0
    capfd.readouterr()
    assert main([f"--loadEngine={engine}", *FAST]) == 0
    err = capfd.readouterr().err
    assert "onnxruntime" not in err  # ORT's INFO log is on only with --verbose


@pytest.mark.parametrize("flag", ["--exportOutput", "--exportProfile", "--exportLayerInfo"])
def test_json_reports_never_overwrite_other_files(capsys, dynamic_onnx, tmp_path, flag) -> None:
    other = tmp_path / "model.onnx"
    other.write_bytes(Path(dynamic_onnx).read_bytes())  # a model the report must not replace
    before = other.read_bytes()
    rc, _, err = run_exec(capsys, f"--onnx={dynamic_onnx}", f"{flag}={other}", *FAST)
    assert rc == 1 and len(err) == 1, err
    assert f"{flag} {other} exists and is not an earlier {flag} file (" in err[0]
    assert other.read_bytes() == before
    rc, _, err = run_exec(capsys, f"--onnx={dynamic_onnx}", f"{flag}={dynamic_onnx}", *FAST)
    assert rc == 1 and "would destroy the input" in err[0]
    report = tmp_path / "r.json"
    for _ in range(2):  # an earlier report of the same kind is replaced
        assert run_exec(capsys, f"--onnx={dynamic_onnx}", f"{flag}={report}", *FAST)[0] == 0
    assert report.read_bytes().lstrip()[:1] in (b"[", b"{")

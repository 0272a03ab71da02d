"""``trtqat-exec`` outputs never clobber other files (recognised by content), trtexec flags
carry over with [W] lines, and non-finite inputs and outputs are handled in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtqat.cli.exec_cmd import main
from trtqat.engines import trtexec_io

from .test_ort_qdq import _feeds, make_tiny_qdq

FAST = ["--shapes=x:2x3x8x8", "--duration=0.01", "--warmUp=0", "--iterations=2",
        "--avgRuns=1"]

# files of other kinds that a report must not replace (each as trtqat writes it)
FOREIGN = {
    "sidecar": {"format": "trtqat-engine-sidecar", "backend": "ort", "payload_size": 1},
    "export.json": {"checkpoint": "runs/qat/best.pt", "variant": "all", "results": []},
    "report.json": {"backend": "ort", "results": [{"name": "fp32", "status": "ok"}]},
}


def _run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err.strip().splitlines()


def _foreign(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / (kind if "." in kind else f"{kind}.json")
    if kind == "metrics.jsonl":
        path.write_text('{"stage": "fp32", "epoch": 1}\n{"stage": "fp32", "epoch": 2}\n')
    else:
        path.write_text(json.dumps(FOREIGN[kind]))
    return path


@pytest.mark.parametrize("flag", ["--exportOutput", "--exportProfile", "--exportLayerInfo",
                                  "--exportTimes"])
@pytest.mark.parametrize("kind", ["sidecar", "export.json", "report.json", "metrics.jsonl"])
def test_reports_never_replace_another_json_file(capsys, dynamic_onnx, tmp_path, flag, kind):
    other = _foreign(tmp_path, kind)
    before = other.read_bytes()
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"{flag}={other}", *FAST)
    assert rc == 1 and len(err) == 1, err
    assert f"exists and is not an earlier {flag} file" in err[0]
    assert other.read_bytes() == before


def test_a_report_replaces_only_an_earlier_report_of_its_own_kind(capsys, dynamic_onnx,
                                                                  tmp_path):
    names = {"exportOutput": "outputs", "exportProfile": "profile",
             "exportLayerInfo": "layers", "exportTimes": "times"}
    paths = {flag: tmp_path / f"{kind}.json" for flag, kind in names.items()}
    argv = [f"--{flag}={path}" for flag, path in paths.items()]
    for _ in range(2):  # the second run replaces its own reports
        rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", *argv, *FAST)
        assert rc == 0, err
    for flag, path in paths.items():
        assert trtexec_io.report_kind(path) == names[flag]
    for flag in names:  # another report kind is another file
        for kind, path in paths.items():
            if kind != flag:
                rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--{flag}={path}", *FAST)
                assert rc == 1 and "is not an earlier" in err[0], (flag, kind)


def test_two_outputs_may_not_share_a_file(capsys, dynamic_onnx, tmp_path):
    same = tmp_path / "r.json"
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--exportOutput={same}",
                      f"--exportProfile={same}", *FAST)
    assert rc == 1 and "is also --exportOutput" in err[0]
    engine = tmp_path / "m.engine"
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--saveEngine={engine}",
                      f"--exportLayerInfo={engine}.json", *FAST)
    assert rc == 1 and "is also the sidecar of --saveEngine" in err[0]
    assert not engine.exists() and not same.exists()


def test_outputs_and_inputs_are_compared_after_resolving_the_path(capsys, dynamic_onnx,
                                                                tmp_path):
    """``..``, ``.`` and symbolic links name one file: no output replaces another, or the
    input, through a path written differently."""
    w = tmp_path / "w"
    (w / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(w)
    cases = [
        ([f"--saveEngine={w}/e.engine", f"--exportTimes={w}/sub/../e.engine"],
         "is also --saveEngine"),
        ([f"--saveEngine={w}/e.engine", f"--exportTimes={tmp_path}/link/e.engine.json"],
         "is also the sidecar of --saveEngine"),
        ([f"--exportTimes={w}/t.json", f"--exportOutput={w}/./sub/../t.json"],
         "is also --exportTimes"),
        ([f"--saveEngine={w}/../{dynamic_onnx.name}"], "is also the input --onnx"),  # tmp_path
    ]
    for argv, needle in cases:
        rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", *argv, *FAST)
        assert rc == 1 and len(err) == 1 and needle in err[0], (argv, err)
    assert sorted(p.name for p in w.rglob("*")) == ["sub"]


def test_save_engine_refuses_a_foreign_file_where_its_sidecar_goes(capsys, dynamic_onnx,
                                                                    tmp_path):
    report = _foreign(tmp_path, "report.json")  # compare's report.json
    before = report.read_bytes()
    target = tmp_path / "report"
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--saveEngine={target}",
                      "--skipInference")
    assert rc == 1 and len(err) == 1, err
    assert "the sidecar of --saveEngine" in err[0] and "is not a trtqat engine sidecar" in err[0]
    assert report.read_bytes() == before and not target.exists()
    # an earlier engine with its own sidecar is replaced
    engine = tmp_path / "m.engine"
    for _ in range(2):
        assert _run(capsys, f"--onnx={dynamic_onnx}", f"--saveEngine={engine}",
                    "--skipInference")[0] == 0
    # a file that merely has some JSON beside it is not an engine
    plain = tmp_path / "notes"
    plain.write_text("my notes")
    (tmp_path / "notes.json").write_text("{}")
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--saveEngine={plain}",
                      "--skipInference")
    assert rc == 1 and "is not an engine file" in err[0]


def test_ignored_trtexec_flags_warn_and_the_sidecar_lists_only_what_was_applied(
        capsys, dynamic_onnx, tmp_path):
    engine = tmp_path / "m.engine"
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--saveEngine={engine}",
                      "--useCudaGraph", "--threads", "--stripWeights", "--dumpRefit",
                      "--saveDebugTensors=t,t.bin",
                      "--allowWeightStreaming", "--fp16", "--int8", *FAST)
    assert rc == 0, err
    warned = "\n".join(err)
    for flag in ("--useCudaGraph", "--threads without a number", "--stripWeights",
                 "--dumpRefit", "--saveDebugTensors", "--allowWeightStreaming", "--fp16"):
        assert flag in warned, flag
    assert all(line.startswith("[W] ") for line in err), err
    side = json.loads(Path(f"{engine}.json").read_text())
    assert side["build_options"]["fp16"] is False and side["build_options"]["int8"] is False
    assert side["build_options"]["cuda_graph"] is False
    assert side["ignored_options"] == ["cuda_graph", "fp16", "int8"]
    rc, out, err = _run(capsys, f"--loadEngine={engine}", "--getPlanVersionOnly")
    assert rc == 0 and err == []
    assert out.strip() == f"Plan was created with ONNX Runtime version {side['backend_version']}"


def test_non_finite_load_inputs_are_refused_by_name(capsys, dynamic_onnx, tmp_path):
    x = np.ones((2, 3, 8, 8), np.float32)
    x[1, 2, 3, 4] = np.inf
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "x.npz", x=x)
    x.tofile(tmp_path / "x.bin")
    for name in ("x.npy", "x.npz", "x.bin"):
        rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--loadInputs=x:{tmp_path / name}",
                          f"--exportOutput={tmp_path / 'o.json'}", *FAST)
        assert rc == 1 and len(err) == 1, err
        assert "holds 1 NaN/inf value(s) of 384 for input 'x'" in err[0]
    assert not (tmp_path / "o.json").exists()


@pytest.fixture(scope="module")
def qdq_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("qdq") / "tiny-int8.onnx"
    onnx.save(make_tiny_qdq(), str(path))
    return path


def test_calib_inputs_take_a_lone_array_under_any_name_and_refuse_nan(capsys, qdq_onnx,
                                                                      tmp_path):
    images = np.concatenate([f["input"] for f in _feeds(2)])
    np.savez(tmp_path / "images.npz", images=images)  # not named after the input
    np.save(tmp_path / "images.npy", images)
    for name in ("images.npz", "images.npy"):
        rc, _, err = _run(capsys, f"--onnx={qdq_onnx}", f"--calibInputs={tmp_path / name}",
                          "--skipInference")
        assert rc == 0, err
    images[3, 0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", input=images)
    rc, _, err = _run(capsys, f"--onnx={qdq_onnx}", f"--calibInputs={tmp_path / 'nan.npz'}",
                      "--skipInference")
    assert rc == 1 and len(err) == 1 and "NaN/inf value(s)" in err[0] and "'input'" in err[0]
    np.savez(tmp_path / "two.npz", a=images, b=images)
    rc, _, err = _run(capsys, f"--onnx={qdq_onnx}", f"--calibInputs={tmp_path / 'two.npz'}",
                      "--skipInference")
    assert rc == 1 and len(err) == 1 and "the model's inputs are input" in err[0]


def test_export_output_writes_null_for_non_finite_values(tmp_path, caplog):
    path = trtexec_io.export_outputs({"y": np.array([[1.0, np.nan, -np.inf]], np.float32),
                           "ids": np.array([3, 4])}, tmp_path / "o.json")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data[0]["values"] == [1.0, None, None] and data[1]["values"] == [3, 4]
    assert "output 'y' holds 2 NaN/inf value(s) of 3, written as null" in caplog.text
    assert trtexec_io.report_kind(path) == "outputs"


def test_timing_cache_may_be_no_other_input(capsys, dynamic_onnx, tmp_path):
    before = Path(dynamic_onnx).read_bytes()
    rc, _, err = _run(capsys, f"--onnx={dynamic_onnx}", f"--timingCacheFile={dynamic_onnx}",
                      *FAST)
    assert rc == 1 and "--timingCacheFile" in err[0] and "is also the input --onnx" in err[0]
    assert Path(dynamic_onnx).read_bytes() == before

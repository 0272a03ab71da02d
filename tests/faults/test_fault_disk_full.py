"""A full disk (ENOSPC after N bytes, injected under every writer) during export,
--saveEngine and calibrate: one line, exit 1, nothing half-written, no run without its
checkpoint, and an earlier artifact intact."""

from __future__ import annotations

import json

import onnx
import pytest
from faultlib import disk_full, one_error_line, run_cli, temps

from trtqat.engines import load_engine
from trtqat.runs.checkpoint import load_checkpoint

NET = '''from torch import nn

def make(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, num_classes))
'''
CALIBRATE = ["--data", "synthetic", "--image-size", "16", "--num-batches", "1",
             "--batch-size", "8", "--limit-batches", "1", "--no-progress", "--method", "max"]


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "src" / "net.py"
    path.parent.mkdir()
    path.write_text(NET)
    return f"{path}:make"


@pytest.mark.parametrize("budget", [0, 1000, 20700])
def test_calibrate_on_a_full_disk_leaves_no_run_behind(tmp_path, capsys, monkeypatch, net,
                                                       budget):
    out = tmp_path / "ptq"
    disk_full(monkeypatch, out, budget)  # args.yaml fits in 1000 bytes, a checkpoint does not
    rc, err = run_cli(capsys, ["calibrate", "--model", net, *CALIBRATE, "--out", str(out)])
    one_error_line(rc, err, "No space left on device")
    assert "cannot write" in err[0] and "free some space" in err[0]
    assert not out.exists() or [p.name for p in out.iterdir()] == []


def test_export_and_save_engine_on_a_full_disk(tmp_path, capsys, monkeypatch, net,
                                               conv_onnx):
    ptq = tmp_path / "ptq"
    rc, err = run_cli(capsys, ["calibrate", "--model", net, *CALIBRATE, "--out", str(ptq)])
    assert rc == 0, err
    out = tmp_path / "export"
    state = disk_full(monkeypatch, tmp_path / "export", 0)
    rc, err = run_cli(capsys, ["export", "-c", str(ptq), "--variant", "int8", "--out", str(out),
                               "--val-batches", "1"])
    one_error_line(rc, err, "No space left on device")
    assert "cannot write" in err[0] and ".onnx" in err[0]
    assert list(out.glob("*.onnx")) == [] and temps(out) == []
    state["left"] = 3000  # room for the ONNX file, not for export.json as well
    rc, err = run_cli(capsys, ["export", "-c", str(ptq), "--variant", "int8", "--out", str(out),
                               "--val-batches", "1"])
    one_error_line(rc, err, "export.json")
    for path in out.glob("*.onnx"):  # what was written is whole
        onnx.checker.check_model(str(path))
    assert not (out / "export.json").exists() and temps(out) == []
    # --saveEngine: an engine and its sidecar, both or neither; an earlier pair stays intact
    engines = tmp_path / "engines"
    engine = engines / "m.engine"
    disk_full(monkeypatch, engines, 1 << 30)
    assert run_cli(capsys, ["trtqat-exec", f"--onnx={conv_onnx}", f"--saveEngine={engine}",
                            "--skipInference"])[0] == 0
    before = (engine.read_bytes(), engine.with_name("m.engine.json").read_bytes())
    for budget in (0, len(before[0]) + 10):  # the engine fits, its sidecar does not
        disk_full(monkeypatch, engines, budget)
        rc, err = run_cli(capsys, ["trtqat-exec", f"--onnx={conv_onnx}",
                                   f"--saveEngine={engine}", "--skipInference"])
        one_error_line(rc, err, "No space left on device")
        assert "m.engine" in err[0] and "no engine was written" in err[0]
        assert (engine.read_bytes(), engine.with_name("m.engine.json").read_bytes()) == before
        assert temps(engines) == []
    load_engine(engine)
    new = engines / "new.engine"
    rc, err = run_cli(capsys, ["trtqat-exec", f"--onnx={conv_onnx}", f"--saveEngine={new}",
                               "--skipInference"])
    one_error_line(rc, err, "No space left on device")
    assert sorted(p.name for p in engines.iterdir()) == ["m.engine", "m.engine.json"]


def test_a_full_disk_while_training_keeps_the_last_good_checkpoint(tmp_path, capsys,
                                                                   monkeypatch, tiny):
    from tiny import train_argv

    out = tmp_path / "run"
    assert run_cli(capsys, train_argv(out, "--stop-after", "1", epochs=2))[0] == 0
    good = load_checkpoint(out / "last.pt")["epoch"]
    state = disk_full(monkeypatch, out, 0)
    rc, err = run_cli(capsys, train_argv(out, "--resume", epochs=2))
    one_error_line(rc, err, "No space left on device")
    state["left"] = 1 << 40
    assert load_checkpoint(out / "last.pt")["epoch"] == good and temps(out) == []
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line), dict) for line in lines if line.strip())
    rc, err = run_cli(capsys, train_argv(out, "--resume", epochs=2))  # space again: it goes on
    assert rc == 0, err
    assert load_checkpoint(out / "last.pt")["epoch"] == 2


def _matmul_onnx(path):
    """An ONNX model whose files outgrow a 4 KiB file-size limit: input (N, 4) @ W (4, 512)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 512), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["output"])], "mm",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                             ["N", 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                             ["N", 512])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_writers_in_onnx_runtime_name_the_full_disk(tmp_path, conv_onnx):
    """ONNX Runtime's own writes (the optimised model of a build; the layer profile of a model
    small enough to build) under a 4 KiB file-size limit (``ulimit -f``, SIGXFSZ ignored: EFBIG): one line naming the file
    and the errno, not INVALID_PROTOBUF or a JSONDecodeError; nothing half-written."""
    import os
    import subprocess
    import sys

    from faultlib import ROOT

    model = _matmul_onnx(tmp_path / "mm.onnx")
    out = tmp_path / "out"
    out.mkdir()
    py = sys.executable
    script = (f"trap '' XFSZ; ulimit -f 4; cd {tmp_path}; "
              f"{py} -m trtqat build --onnx {model} --out out/m.engine; "
              f"{py} -c 'from trtqat.cli.exec_cmd import main; raise SystemExit(main())' "
              f"--onnx={conv_onnx} --exportProfile=out/p.json --duration=0.05 --warmUp=0 "
              "--iterations=20")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 2, proc.stderr[-3000:]
    assert "optimized.onnx: File too large (errno 27); no engine was written" in errors[0]
    assert "cannot write ONNX Runtime's layer profile" in errors[1]
    assert sorted(p.name for p in out.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["trtqat-exec", "--onnx={onnx}", "--exportTimes={out}/t.json"],
    ["trtqat-exec", "--onnx={onnx}", "--exportLayerInfo={out}/l.json"],
    ["trtqat-exec", "--onnx={onnx}", "--exportProfile={out}/p.json"],
    ["sensitivity", "--checkpoint", "{ptq}", "--top", "1", "--no-progress", "--out", "{out}"],
], ids=["exportTimes", "exportLayerInfo", "exportProfile", "sensitivity"])
def test_reports_on_a_full_disk_are_one_line(tmp_path, capsys, monkeypatch, net, conv_onnx,
                                             argv):
    ptq = tmp_path / "ptq"
    if "sensitivity" in argv:
        rc, err = run_cli(capsys, ["calibrate", "--model", net, *CALIBRATE, "--out", str(ptq)])
        assert rc == 0, err
    out = tmp_path / "out"
    out.mkdir()
    timing = ["--duration=0.05", "--warmUp=0", "--iterations=5"] if argv[0] != "sensitivity" \
        else []
    disk_full(monkeypatch, out, 0)
    rc, err = run_cli(capsys, [a.format(onnx=conv_onnx, out=out, ptq=ptq) for a in argv]
                      + timing)
    one_error_line(rc, err, "No space left on device (errno 28)")
    assert "cannot write" in err[0] and str(out) in err[0]
    assert list(out.iterdir()) == []

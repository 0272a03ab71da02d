"""Artifacts: SIGKILL during each write, then a rerun that cleans up; the umask's mode;
outputs that never destroy an input or a file that is not ours; stale temp files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import onnx
import pytest
from faultlib import killed, one_error_line, run_cli, temps

from trtqat.atomic import remove_stale_temps, write_atomic
from trtqat.engines import load_engine
from trtqat.export.onnx_export import ExportResult, write_checked

EXEC = ["--shapes=x:2x3x8x8", "--duration=0.01", "--warmUp=0", "--iterations=2", "--avgRuns=1"]


def test_sigkill_during_an_onnx_write_then_rerun(conv_onnx, tmp_path):
    out = tmp_path / "out" / "m.onnx"
    killed("m.onnx", 1, "write_checked", str(conv_onnx), str(out))
    assert not out.exists() and len(temps(out.parent)) == 1
    write_checked(onnx.load(conv_onnx), ExportResult(out, "fp32", 17, True))
    onnx.checker.check_model(str(out))
    assert temps(out.parent) == []


@pytest.mark.parametrize("target, argv", [
    ("e.engine", ["--saveEngine={engine}", "--skipInference"]),
    ("t.json", ["--loadEngine={engine}", "--exportTimes={times}", *EXEC]),
])
def test_sigkill_during_an_engine_or_report_write_keeps_the_old_file(conv_onnx, tmp_path,
                                                                     capsys, target, argv):
    names = {"engine": tmp_path / "e.engine", "times": tmp_path / "t.json"}
    first = [f"--onnx={conv_onnx}", f"--saveEngine={names['engine']}",
             f"--exportTimes={names['times']}", *EXEC]
    assert run_cli(capsys, ["trtqat-exec", *first])[0] == 0
    old = (tmp_path / target).read_bytes()
    argv = [a.format(**names) for a in argv]
    if "--loadEngine" not in argv[0]:
        argv = [f"--onnx={conv_onnx}", *argv]
    killed(target, 1, "trtqat-exec", *argv)
    assert (tmp_path / target).read_bytes() == old  # the old artifact is intact
    # an engine and its sidecar are both written in full before either is renamed
    assert len(temps(tmp_path)) == (2 if target == "e.engine" else 1)
    rc, err = run_cli(capsys, ["trtqat-exec", *argv])
    assert rc == 0, err
    assert temps(tmp_path) == []
    load_engine(names["engine"])
    assert isinstance(json.loads(names["times"].read_text()), list)


@pytest.mark.parametrize("mode", [0o022, 0o077])
def test_artifacts_get_the_umask_mode(conv_onnx, tmp_path, capsys, mode):
    old = os.umask(mode)
    try:
        write_checked(onnx.load(conv_onnx), ExportResult(tmp_path / "m.onnx", "fp32", 17, True))
        write_atomic(tmp_path / "export.json", lambda f: f.write(b"{}"))
        rc, err = run_cli(capsys, ["build", "--onnx", str(conv_onnx), "--out",
                                   str(tmp_path / "m.engine")])
        assert rc == 0, err
    finally:
        os.umask(old)
    for name in ("m.onnx", "export.json", "m.engine"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mode, name


def test_build_never_destroys_its_input_or_a_foreign_file(conv_onnx, tmp_path, capsys):
    data = conv_onnx.read_bytes()
    rc, err = run_cli(capsys, ["build", "--onnx", str(conv_onnx), "--out", str(conv_onnx)])
    one_error_line(rc, err, "is also the input --onnx: writing it would destroy the input")
    rc, err = run_cli(capsys, ["trtqat-exec", f"--onnx={conv_onnx}",
                               f"--saveEngine={conv_onnx}", "--skipInference"])
    one_error_line(rc, err, "--saveEngine")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    rc, err = run_cli(capsys, ["build", "--onnx", str(conv_onnx), "--out", str(notes)])
    one_error_line(rc, err, "exists and is not an engine file")
    rc, err = run_cli(capsys, ["trtqat-exec", f"--onnx={conv_onnx}", *EXEC,
                               f"--exportTimes={notes}"])
    one_error_line(rc, err, "exists and is not an earlier --exportTimes file")
    assert conv_onnx.read_bytes() == data and notes.read_text() == "mine"
    engine = tmp_path / "m.engine"
    for _ in range(2):  # an earlier engine is replaced
        rc, err = run_cli(capsys, ["build", "--onnx", str(conv_onnx), "--out", str(engine)])
        assert rc == 0, err


def test_only_our_stale_temp_files_are_removed(tmp_path):
    """Only names of exactly temp_path's pattern (.NAME.PID-8CHARS.tmp) whose writer is gone;
    the user's look-alikes (.mydata.backup.tmp, old mkstemp-style names) always survive."""
    dead, live = 2**22 + 12345, os.getpid()  # above Linux's pid_max: never a live process
    names = [f".m.onnx.{dead}-abc_1234.tmp", f".m.onnx.{live}-abc_1234.tmp", ".m.onnx.old.tmp",
             ".m.onnx.new.tmp", f".m.onnx.{dead}-abc.tmp", f".other.onnx.{dead}-x1234567.tmp",
             "m.onnx.tmp", ".m.onnx.x.partial", ".mydata.backup.tmp"]
    for name in names:
        (tmp_path / name).write_text("x")
    hour_ago = time.time() - 7200
    os.utime(tmp_path / ".m.onnx.old.tmp", (hour_ago, hour_ago))
    write_atomic(tmp_path / "m.onnx", lambda f: f.write(b"onnx"))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(set(names) - {f".m.onnx.{dead}-abc_1234.tmp"} | {"m.onnx"})
    # a run folder opened under its lock: every temp file of ours is stale, but our own
    removed = remove_stale_temps(tmp_path, all_dead=True)
    assert sorted(p.name for p in removed) == [f".other.onnx.{dead}-x1234567.tmp"]
    assert (tmp_path / ".mydata.backup.tmp").read_text() == "x"


def test_json_is_written_whole_or_not_at_all(tmp_path):
    from trtqat.atomic import write_json

    path = write_json(tmp_path / "r.json", {"a": Path("x")}, default=str)
    assert json.loads(path.read_text()) == {"a": "x"}
    assert path.read_text().endswith("}\n")
    with pytest.raises(TypeError):  # not serializable: the old file stays, no temp is left
        write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": "x"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]

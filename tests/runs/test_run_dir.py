"""The run folder: guarded creation, metrics truncation on resume, optional TensorBoard."""

from __future__ import annotations

import json

import pytest

from trtqat.runs.ownership import claim
from trtqat.runs.run_dir import RunDir, RunDirError, check_out_dir, read_metrics


def test_truncate_drops_lines_without_a_checkpoint(tmp_path):
    run = RunDir(tmp_path / "run", tensorboard=False)
    run.start({"a": 1}, resume=False)
    for epoch in range(4):
        run.log_metrics({"stage": "fp32", "epoch": epoch})
    with open(run.file("metrics.jsonl"), "a") as f:
        f.write('{"stage": "fp32", "ep')  # cut short by a crash
    run.truncate_metrics("fp32", 2)
    assert [r["epoch"] for r in read_metrics(run.path)] == [0, 1, 2]
    assert json.loads(run.file("metrics.jsonl").read_text().splitlines()[-1])["epoch"] == 2


def test_out_dir_guards(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        check_out_dir(tmp_path / "file", resume=False, overwrite=False)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.pt").write_bytes(b"")
    with pytest.raises(RunDirError, match=r"holds files that are not trtqat's \(last.pt\)"):
        check_out_dir(tmp_path / "run", resume=False, overwrite=True)  # not provably ours
    claim(tmp_path / "run", ["last.pt"])  # listed in the manifest: trtqat wrote it
    with pytest.raises(RunDirError, match="already holds a run"):
        check_out_dir(tmp_path / "run", resume=False, overwrite=False)
    assert check_out_dir(tmp_path / "run", resume=False, overwrite=True) == tmp_path / "run"
    assert check_out_dir(tmp_path / "run", resume=True, overwrite=False) == tmp_path / "run"


def test_tensorboard_scalars_when_installed(tmp_path):
    pytest.importorskip("tensorboard")
    run = RunDir(tmp_path / "run")
    run.start({}, resume=False)
    run.log_metrics({"stage": "fp32", "epoch": 1, "val_top1": 50.0})
    run.close()
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_other_ranks_write_nothing(tmp_path):
    run = RunDir(tmp_path / "run", enabled=False)
    run.start({"a": 1}, resume=False)
    run.log_metrics({"stage": "fp32", "epoch": 1})
    assert not (tmp_path / "run").exists()

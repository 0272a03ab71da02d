"""trtqat replaces or deletes only files it can prove it wrote (the run folder's manifest, or
the content of an older run's known files); a folder holding anything else is refused."""

from __future__ import annotations

import os

import pytest
import torch

from trtqat.runs.checkpoint import save_checkpoint
from trtqat.runs.ownership import MANIFEST, entries, read_manifest
from trtqat.runs.run_dir import RunDir, RunDirError
from trtqat.runs.run_lock import RunGuard, aside_path


def _run(folder, seed=0):
    """A finished run as the stages write it (args, metrics, checkpoints, manifest)."""
    with RunGuard(folder, resume=False, overwrite=True) as guard:
        run = RunDir(guard.path, tensorboard=False)
        run.start({"out": str(folder), "seed": seed}, resume=False)
        run.log_metrics({"stage": "fp32", "epoch": 1})
        save_checkpoint(run.file("last.pt"), {"stage": "fp32", "model": {},
                                              "state_dict": {"w": torch.ones(1) * seed}})
        run.close()
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_foreign_files_are_refused_by_name_and_kept_even_with_overwrite(tmp_path):
    out = tmp_path / "p1"
    old = _run(out)
    (out / "notes.txt").write_text("mine")
    (out / "mydata").mkdir()
    (out / "mydata" / "file.csv").write_text("1,2")
    (out / ".mydata.backup.tmp").write_text("mine too")  # not trtqat's temp pattern
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match=r"--out .*p1 holds files that are not trtqat's "
                           r"\(\.mydata\.backup\.tmp, mydata/, notes\.txt\).*--overwrite "
                           "included"):
            RunGuard(out, resume=False, overwrite=overwrite)
    assert _files(out) == old | {"notes.txt": b"mine", ".mydata.backup.tmp": b"mine too"}
    assert (out / "mydata" / "file.csv").read_text() == "1,2"
    # a user's TensorBoard file makes tb/ theirs too
    for name in ("notes.txt", ".mydata.backup.tmp"):
        (out / name).unlink()
    (out / "mydata" / "file.csv").unlink()
    (out / "mydata").rmdir()
    (out / "tb").mkdir()
    (out / "tb" / "events.mine").write_text("x")
    with pytest.raises(RunDirError, match=r"\(tb/events\.mine\)"):
        RunGuard(out, resume=False, overwrite=True)


def test_runs_of_older_versions_are_recognised_by_content(tmp_path):
    out = tmp_path / "old"
    old = _run(out)
    (out / MANIFEST).unlink()  # written before the manifest existed
    (out / "tb").mkdir()
    (out / "tb" / "events.out.tfevents.1.host.2.0").write_bytes(b"e")
    assert entries(out) == (["args.yaml", "last.pt", "metrics.jsonl", "tb"], [])
    new = _run(out, seed=1)  # --overwrite replaces them, manifest and all
    assert new["last.pt"] != old["last.pt"] and read_manifest(out) >= {"args.yaml", "last.pt"}
    assert not (out / "tb").exists() and not aside_path(out).exists()
    # the same names with other content are the user's
    user = tmp_path / "proj"
    user.mkdir()
    (user / "args.yaml").write_text("lr: 1\n")
    (user / "metrics.jsonl").write_text('{"loss": 1}\n')
    (user / "last.pt").write_bytes(b"not a checkpoint")
    assert entries(user) == ([], ["args.yaml", "last.pt", "metrics.jsonl"])


def test_overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    old = _run(out)
    with RunGuard(out, resume=False, overwrite=True) as guard:  # fails before its checkpoint
        RunDir(guard.path, tensorboard=False).start({"out": "x", "seed": 9}, resume=False)
        assert sorted(os.listdir(aside_path(out))) == sorted(old)  # manifest included
    assert _files(out) == old and not aside_path(out).exists()
    # killed before its checkpoint: the next command puts the old run back
    guard = RunGuard(out, resume=False, overwrite=True)
    RunDir(guard.path, tensorboard=False).start({"out": "x", "seed": 9}, resume=False)
    guard._lock.release()  # what a SIGKILL leaves: the aside folder, the new run's files
    RunGuard(out, resume=True, overwrite=False).close()
    assert _files(out) == old and not aside_path(out).exists()


def test_failure_clean_up_removes_only_what_the_command_wrote(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    run = RunDir(out)
    run.start({"out": str(out), "seed": 0}, resume=False)
    run.log_metrics({"stage": "ptq", "epoch": 0, "val_top1": 1.0})
    (out / "notes.txt").write_text("mine")  # the user's, made while the command ran
    (out / "tb" / "events.mine").write_text("mine")
    run.discard()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        MANIFEST, "notes.txt", "tb", "tb/events.mine"]
    (out / "notes.txt").unlink()
    (out / "tb" / "events.mine").unlink()
    (out / "tb").rmdir()
    (out / MANIFEST).unlink()
    out.rmdir()
    run = RunDir(out, tensorboard=False)
    run.start({"out": str(out), "seed": 0}, resume=False)
    run.discard()
    assert not out.exists()  # the folder it made is gone; the one the user made stays:
    out.mkdir()
    run = RunDir(out, tensorboard=False)
    run.start({"out": str(out), "seed": 0}, resume=False)
    run.discard()
    assert out.is_dir() and not list(out.iterdir())


def test_out_dot_is_a_run_folder_like_any_other(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from pathlib import Path

    first = _run(Path("."))
    second = _run(Path("."), seed=2)
    assert second["last.pt"] != first["last.pt"] and not aside_path(Path(".")).exists()


def test_an_older_versions_interrupted_overwrite_is_restored_only_where_nothing_is_lost(
        tmp_path, caplog):
    from trtqat.runs.run_lock import legacy_aside_path

    out = tmp_path / "run"
    old = _run(out)
    os.replace(out, legacy_aside_path(out))  # what an older trtqat's killed --overwrite left
    out.mkdir()
    RunGuard(out, resume=True, overwrite=False).close()
    assert _files(out) == old and not legacy_aside_path(out).exists()
    os.replace(out, legacy_aside_path(out))
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # in the way: the old folder is left, and said so
    with pytest.raises(RunDirError, match="notes.txt"):
        RunGuard(out, resume=False, overwrite=True)
    assert _files(legacy_aside_path(out)) == old and _files(out) == {"notes.txt": b"mine"}
    assert "move back what you need" in caplog.text

"""Run folders: one writer at a time, --overwrite that keeps the old run until the new one
has a checkpoint and never touches the user's files, SIGKILL during a checkpoint write, then
rerun and --resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from faultlib import ROOT, killed, one_error_line, run_cli, temps
from tiny import train_argv

from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.run_lock import aside_path, lock_path


def _finished_run(capsys, out):
    rc, err = run_cli(capsys, train_argv(out))
    assert rc == 0, err
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def _hold_lock(folder):
    """A separate process that holds the run folder's lock until killed."""
    code = ("import sys, time; from trtqat.runs.run_lock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys,
                                                                         tiny):
    out = tmp_path / "run"
    holder = _hold_lock(out)
    try:
        rc, err = run_cli(capsys, train_argv(out))
        one_error_line(rc, err, f"is in use by another trtqat process (PID {holder.pid})")
        assert not out.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path(out).read_text().strip() == str(holder.pid)  # stale: its holder is dead
    rc, err = run_cli(capsys, train_argv(out))
    assert rc == 0, err
    assert load_checkpoint(out / "last.pt")["epoch"] == 1
    assert not lock_path(out).exists() and temps(tmp_path) == []


def test_overwrite_that_fails_before_its_first_checkpoint_keeps_the_old_run(tmp_path, capsys,
                                                                            tiny):
    out = tmp_path / "run"
    old = _finished_run(capsys, out)
    rc, err = run_cli(capsys, train_argv(out, "--overwrite", "--data", str(tmp_path / "nope")))
    one_error_line(rc, err, "no such folder")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == old
    assert not aside_path(out).exists() and not lock_path(out).exists()
    rc, err = run_cli(capsys, ["calibrate", "--checkpoint", str(out / "best.pt"), "--out",
                               str(out), "--overwrite"])
    one_error_line(rc, err, "is inside --out")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == old
    rc, err = run_cli(capsys, train_argv(out, "--overwrite", "--seed", "1"))
    assert rc == 0, err
    assert load_checkpoint(out / "last.pt")["args"]["seed"] == 1
    assert not aside_path(out).exists()


def test_a_killed_overwrite_is_undone_by_the_next_command(tmp_path, capsys, tiny):
    from trtqat.runs.ownership import MANIFEST, claim

    out = tmp_path / "run"
    old = _finished_run(capsys, out)
    # what a SIGKILL between the move and the first checkpoint leaves
    aside_path(out).mkdir()
    for path in list(out.iterdir()):
        if path != aside_path(out):
            os.replace(path, aside_path(out) / path.name)
    claim(out, ["args.yaml"])
    (out / "args.yaml").write_text("half: a new run\n")
    rc, err = run_cli(capsys, train_argv(out, "--resume"))  # the old run, restored, is done
    assert rc == 0, err
    assert not aside_path(out).exists() and (out / MANIFEST).is_file()
    for name in ("last.pt", "best.pt"):  # args.yaml now records resume: true
        assert (out / name).read_bytes() == old[name], name


def test_user_files_in_out_are_refused_and_kept_overwrite_included(tmp_path, capsys, tiny):
    out = tmp_path / "p1"
    old = _finished_run(capsys, out)
    (out / "notes.txt").write_text("mine")
    (out / "net.py").write_text("def make(): ...\n")
    for extra in ((), ("--overwrite",), ("--overwrite", "--model", f"{out}/net.py:make")):
        rc, err = run_cli(capsys, train_argv(out, *extra))
        one_error_line(rc, err, "not trtqat's (net.py, notes.txt)")
        assert _files_now(out) == old | {"notes.txt": b"mine",
                                         "net.py": b"def make(): ...\n"}


def _files_now(out):
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def test_sigkill_during_a_checkpoint_write_then_resume(tmp_path, capsys, tiny):
    out = tmp_path / "run"
    killed("last.pt", 2, "trtqat", *train_argv(out, epochs=2), cwd=tmp_path)  # dies saving epoch 2
    assert load_checkpoint(out / "last.pt")["epoch"] == 1  # the final name holds epoch 1
    assert len(temps(out)) == 1 and temps(out)[0].startswith(".last.pt.")
    rc, err = run_cli(capsys, train_argv(out, "--resume", epochs=2))
    assert rc == 0, err
    assert load_checkpoint(out / "last.pt")["epoch"] == 2
    assert temps(out) == [] and not lock_path(out).exists()


def test_nan_stop_keeps_and_names_the_last_finite_checkpoint(tmp_path, capsys, monkeypatch):
    """The training loss stays finite, but BatchNorm's running_var turns NaN in epoch 2."""
    import torch
    from tiny import tiny_model

    from trtqat.families.cnn import CNNFamily

    def poisoned(self, name, num_classes=None, **_):
        model = tiny_model(name, num_classes)
        steps = {"n": 0}

        def hook(module, inputs):
            steps["n"] += module.training
            if steps["n"] == 4 and not module.training:  # validation of epoch 2
                module.running_var.fill_(float("nan"))
        model[1].register_forward_pre_hook(hook)
        return model

    monkeypatch.setattr(CNNFamily, "build", poisoned)
    out = tmp_path / "run"
    rc, err = run_cli(capsys, train_argv(out, epochs=3))
    line = one_error_line(rc, err, "not finite after epoch 2 ('1.running_var' holds 4 of 4")
    assert f"The last finite checkpoint is kept: {out / 'last.pt'}." in line
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values()
               if t.is_floating_point())


@pytest.mark.parametrize("lr", ["1e6", "1e308"])  # a NaN loss; a weight update overflowing
def test_a_diverging_lr_stops_without_a_poisoned_checkpoint(tmp_path, capsys, tiny,
                                                            monkeypatch, lr):
    for module in ("trtqat.runopts", "trtqat.runs.recipes"):  # --lr is at most 10 otherwise
        monkeypatch.setattr(f"{module}.MAX_LR", 1e309)
    out = tmp_path / "run"
    rc, err = run_cli(capsys, train_argv(out, "--lr", lr, epochs=2))
    line = one_error_line(rc, err, "stopped.")
    assert lr != "1e308" or "the weight update overflowed (learning rate 1e+308)" in line
    if "No epoch finished" in line:  # a stop before any checkpoint leaves no folder
        assert "no run folder is left" in line and not out.exists()
    from trtqat.runs.health import finite_checkpoint

    for name in ("last.pt", "best.pt"):
        assert not (out / name).exists() or finite_checkpoint(out / name), line
    assert temps(out) == []


@pytest.mark.parametrize("mode", [0o022, 0o002])
def test_checkpoints_and_run_files_get_the_umask_mode(tmp_path, capsys, tiny, mode):
    old = os.umask(mode)
    try:
        out = tmp_path / "run"
        _finished_run(capsys, out)
    finally:
        os.umask(old)
    for name in ("last.pt", "best.pt", "args.yaml", "metrics.jsonl"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~mode, name


def test_a_refused_run_leaves_no_folders_behind(tmp_path, capsys, tiny):
    out = tmp_path / "new" / "deeper" / "run"
    rc, err = run_cli(capsys, train_argv(out, "--data", str(tmp_path / "nope")))
    one_error_line(rc, err, "no such folder")
    assert not (tmp_path / "new").exists()

"""``--threads N``: every computing subcommand takes it, with one type, applies it before its
work starts, and refuses anything but a whole number >= 1 in one line."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from trtqat import cli, threads
from trtqat.cli import build_parser

# subcommand -> the arguments it needs besides --threads; the stub replaces its run()
COMMANDS = {
    "train": [], "calibrate": [], "qat": ["-c", "c.pt"], "export": ["-c", "c.pt"],
    "sensitivity": ["-c", "c.pt"], "demo": [], "compare": [],
    "build": ["--onnx", "m.onnx", "-o", "m.engine"],
}
NO_THREADS = {"lint"}  # static checks of an ONNX file: no torch, no ONNX Runtime session


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    threads.reset_threads()


def test_every_subcommand_is_listed() -> None:
    action = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
                  and "train" in a.choices)
    assert set(action.choices) == set(COMMANDS) | NO_THREADS
    for name, sub in action.choices.items():
        assert ("--threads" in sub._option_string_actions) == (name not in NO_THREADS), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_threads_applied_before_the_command(name: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(f"trtqat.cli.cmd_{name}")
    seen = {}

    def stub(args) -> int:
        seen.update(torch=torch.get_num_threads(), ort=threads.cpu_threads(), args=args.threads)
        return 0

    monkeypatch.setattr(module, "run", stub)
    torch.set_num_threads(2)
    assert cli.main([name, *COMMANDS[name], "--threads", "1"]) == 0
    assert seen["args"] == 1 and seen["ort"] == 1
    # build runs ONNX Runtime only (engines import no torch): torch keeps its count
    assert seen["torch"] == (2 if name == "build" else 1)


@pytest.mark.parametrize("name", ["train", "export", "build"])
@pytest.mark.parametrize("bad", ["0", "-1", "abc", "1.5"])
def test_bad_thread_counts_are_one_line(name: str, bad: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main([name, *COMMANDS[name], f"--threads={bad}"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 1 and "\n" not in err, err
    assert "--threads" in err and "expected an integer >= 1 (CPU threads)" in err


def test_library_configs_refuse_bad_threads() -> None:
    from trtqat.runopts import ConfigError, RunOptions

    with pytest.raises(ConfigError, match="--threads must be a whole number >= 1"):
        RunOptions(threads=0)
    with pytest.raises(threads.ThreadsError):
        threads.apply_threads(-2)

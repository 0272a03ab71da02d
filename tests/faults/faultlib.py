"""Helpers of the fault-injection tests: in-process CLI runs, the one-line error check,
SIGKILL runs (killer.py) and our temporary files."""

from __future__ import annotations

import builtins
import errno
import os
import subprocess
import sys
from pathlib import Path

from trtqat.cli import main as trtqat_main
from trtqat.cli.exec_cmd import main as exec_main

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


ROOT = HERE.parent.parent


def run_cli(capsys, argv: list[str]) -> tuple[int, list[str]]:
    """Run ``trtqat ARGV`` (or ``trtqat-exec`` if argv[0] is that) in-process:
    (exit status, stderr lines). Parser errors count by their exit status."""
    capsys.readouterr()
    main = exec_main if argv[0] == "trtqat-exec" else trtqat_main
    args = argv[1:] if argv[0] == "trtqat-exec" else argv
    try:
        rc = main(args)
    except SystemExit as exc:
        rc = exc.code
    return int(rc or 0), capsys.readouterr().err.strip().splitlines()


def one_error_line(rc: int, err: list[str], needle: str = "") -> str:
    """Assert exit 1 and a single error line (no traceback) that contains ``needle``."""
    assert rc == 1, err
    assert len(err) == 1, err
    assert "Traceback" not in err[0] and ": error: " in err[0], err
    assert needle in err[0], err
    return err[0]


def killed(target: str, nth: int, *argv: str, cwd: Path | None = None) -> None:
    """Run ``killer.py`` (see there) and check the process died by SIGKILL."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(HERE / "killer.py"), target, str(nth), *argv],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]


def temps(folder: Path) -> list[str]:
    """Our temporary files left in ``folder``."""
    return sorted(p.name for p in folder.glob(".*.tmp"))


class _FullFile:
    """A file opened for writing on a disk that fills up after the shared byte budget."""

    def __init__(self, f, budget: dict) -> None:
        self._f, self._budget = f, budget

    def write(self, data) -> int:
        size = len(data.encode() if isinstance(data, str) else memoryview(data).cast("B"))
        if size > self._budget["left"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._budget["left"] -= size
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


def disk_full(monkeypatch, root: Path, budget: int = 0) -> dict:
    """Make every file opened for writing under ``root`` fail with ENOSPC once ``budget``
    bytes were written in all (``builtins.open``, which every writer of trtqat, torch.save
    through its file object and onnx.save reach). Returns the budget's state."""
    state = {"left": budget}
    real = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):
        f = real(file, mode, *args, **kwargs)
        writing = any(c in mode for c in "wax+")
        if writing and isinstance(file, (str, os.PathLike)) and \
                Path(os.fspath(file)).absolute().is_relative_to(root):
            return _FullFile(f, state)
        return f

    monkeypatch.setattr(builtins, "open", fake_open)
    return state

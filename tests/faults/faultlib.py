"""Helpers of the fault-injection tests: in-process CLI runs, the one-line error check,
SIGKILL runs (killer.py) and our temporary files."""

from __future__ import annotations

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

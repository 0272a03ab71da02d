"""Fault-injection tests: kills, locks, NaN models, corrupt files and invalid values.

Every failing command must exit 1 with one line and no traceback, and leave the run
folder clean: final files load, nothing stale is left, an old run is intact.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtqat.cli import main as trtqat_main
from trtqat.cli.exec_cmd import main as exec_main

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread."""


@pytest.fixture
def tiny(monkeypatch):
    """``trtqat train`` builds the tiny model (tests/faults/tiny.py) instead of resnet18."""
    from tiny import tiny_model

    import trtqat.train.fp32 as fp32

    monkeypatch.setattr(fp32, "build_model", tiny_model)


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


@pytest.fixture
def conv_onnx(tmp_path: Path) -> Path:
    """A tiny ONNX model: Conv + Relu, x[N, 3, 8, 8] (tests/engines/conftest.py)."""
    from engines.conftest import make_conv_model

    return make_conv_model(tmp_path / "conv.onnx")

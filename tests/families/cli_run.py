"""The command line in a subprocess, as a user runs it (the detector CLI tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--limit-batches", "1", "--batch-size", "4", "--no-progress")


def cli_env() -> dict[str, str]:
    """This checkout first on the path, one thread, Ultralytics offline."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "YOLO_OFFLINE": "1"}


def trtqat(*args: str, cwd: Path | None = None, module: str = "trtqat") -> str:
    """``python -m MODULE ARGS`` must succeed; its stdout and stderr."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=cli_env(), cwd=cwd, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr

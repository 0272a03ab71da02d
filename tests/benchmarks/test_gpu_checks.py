"""benchmarks/gpu_checks.py: the prepared GPU run. Its CPU form runs checks end to end and
writes the summary; the budget skips what it cannot cover; bad options fail in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_checks.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_checks  # noqa: E402


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


def test_every_cuda_test_file_exists():
    assert all((ROOT / f).is_file() for f in gpu_checks.CUDA_TEST_FILES)


def test_cpu_form_runs_the_checks_and_writes_the_summary(tmp_path):
    out = tmp_path / "out"
    r = _run("--device", "cpu", "--only", "env,lean", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((out / "summary.json").read_text())
    assert [(row["check"], row["result"], row["rc"]) for row in rows] == [
        ("env", "passed", 0), ("lean", "passed", 0)]
    lean = (out / "lean.log").read_text()
    assert "trtqat lean" in lean and "differ" not in lean.lower()
    assert "| lean | passed |" in (out / "summary.md").read_text()
    assert not list(out.glob("*.tmp"))


def test_the_budget_skips_what_it_cannot_cover(tmp_path):
    r = _run("--device", "cpu", "--only", "eager,format", "--budget", "5", "--out", str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    rows = {row["check"]: row for row in json.loads((tmp_path / "summary.json").read_text())}
    assert rows["eager"]["result"].startswith("skipped:") and "needs about" in rows["eager"]["result"]
    assert rows["format"]["result"] == "skipped: no cpu form"
    assert not (tmp_path / "eager.log").exists()


def test_a_check_over_its_limit_is_killed_and_fails(tmp_path, monkeypatch):
    slow = gpu_checks.Check("slow", None, [sys.executable, "-c", "import time; time.sleep(30)"],
                            0, 1)
    monkeypatch.setattr(gpu_checks, "_checks", lambda out: [slow])
    assert gpu_checks.main(["--device", "cpu", "--out", str(tmp_path)]) == 1
    row = json.loads((tmp_path / "summary.json").read_text())[0]
    assert row["result"] == "overran, killed" and row["seconds"] < 20
    assert "killed after" in (tmp_path / "slow.log").read_text()


@pytest.mark.parametrize("argv, words", [
    (["--only", "bogus", "--device", "cpu"], "unknown check(s) bogus"),
    (["--budget", "0", "--device", "cpu"], "--budget must be > 0"),
])
def test_bad_options_fail_in_one_line(argv, words):
    r = _run(*argv)
    assert r.returncode == 2 and words in r.stderr.strip().splitlines()[-1]


def test_cuda_without_a_gpu_fails_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the refusal does not apply")
    r = _run("--only", "env")
    assert r.returncode == 2 and "sees no CUDA GPU" in r.stderr.strip().splitlines()[-1]

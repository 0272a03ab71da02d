"""train/qat --cuda-graphs through the recipes, on the CPU: the device check stands aside and
the graphed step runs eagerly (capture needs CUDA), so the wiring is what is tested: the
step is the graphed one, metrics stay plain floats, checkpoints load, and a resume may drop
--cuda-graphs."""

from __future__ import annotations

import json

import pytest

from trtqat.cli import main
from trtqat.families import build_from_checkpoint
from trtqat.runs import accel
from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.graphed_step import GraphedStep

RUN = ["--limit-batches", "2", "--no-progress", "--device", "cpu"]


@pytest.fixture
def graphed_calls(monkeypatch) -> list[int]:
    """Allow --cuda-graphs on the CPU and count the graphed steps."""
    monkeypatch.setattr(accel, "check_cuda_graphs", lambda *args, **kwargs: None)
    calls: list[int] = []
    real = GraphedStep.__call__
    monkeypatch.setattr(GraphedStep, "__call__",
                        lambda self, x, y: calls.append(len(y)) or real(self, x, y))
    return calls


def _metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_qat_cuda_graphs_steps_through_the_graphed_step_and_resumes_without_it(
        ptq_run, tmp_path, graphed_calls):
    out = tmp_path / "qat"
    argv = ["qat", "-c", str(ptq_run), "--epochs", "2", "--out", str(out), *RUN]
    assert main([*argv, "--cuda-graphs", "--stop-after", "1"]) == 0
    assert len(graphed_calls) == 2
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt["args"]["cuda_graphs"] is True and ckpt["epoch"] == 1
    assert main([*argv, "--resume"]) == 0  # --cuda-graphs may change on --resume
    assert len(graphed_calls) == 2
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt["epoch"] == 2
    assert all(isinstance(m["lr"], float) for m in _metrics(out))
    build_from_checkpoint(ckpt)


def test_train_cuda_graphs_steps_through_the_graphed_step(tmp_path, graphed_calls):
    out = tmp_path / "fp32"
    assert main(["train", "--data", "synthetic", "--image-size", "16", "--batch-size", "8",
                 "--epochs", "1", "--cuda-graphs", "--out", str(out), *RUN]) == 0
    assert graphed_calls == [8, 8]
    assert all(isinstance(m["lr"], float) for m in _metrics(out))
    assert load_checkpoint(out / "best.pt")["args"]["cuda_graphs"] is True

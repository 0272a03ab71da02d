"""Two CPU processes under torchrun: DDP training, then calibration with merged statistics."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from trtqat.families import build_from_checkpoint
from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.run_dir import read_metrics

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")


def _torchrun(args: list[str], env: dict[str, str], cwd) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "trtqat", *args, "--no-progress", "--device", "cpu"]
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_two_processes_train_and_calibrate_to_identical_amax(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRTQAT_AMAX_DUMP": str(tmp_path / "amax")}
    fp32, ptq = tmp_path / "fp32", tmp_path / "ptq"
    _torchrun(["train", "--model", "resnet18", "--num-classes", "10", "--data", "digits",
               "--image-size", "16", "--batch-size", "16", "--epochs", "1",
               "--limit-batches", "2", "--out", str(fp32)], env, tmp_path)
    assert [r["epoch"] for r in read_metrics(fp32)] == [1]  # rank 0 writes, once
    ckpt = load_checkpoint(fp32 / "last.pt")
    assert ckpt["args"]["world_size"] == 2 and len(ckpt["rng"]) == 2
    build_from_checkpoint(ckpt)

    _torchrun(["calibrate", "--checkpoint", str(fp32 / "best.pt"), "--method", "entropy",
               "--num-batches", "2", "--limit-batches", "2", "--out", str(ptq)], env, tmp_path)
    a0 = torch.load(tmp_path / "amax" / "amax_rank0.pt", weights_only=True)
    a1 = torch.load(tmp_path / "amax" / "amax_rank1.pt", weights_only=True)
    assert a0.keys() == a1.keys() and any("residual_quantizer" in k for k in a0)
    for name in a0:
        assert torch.equal(a0[name], a1[name]), name
    ckpt = load_checkpoint(ptq / "best.pt")
    assert ckpt["stage"] == "ptq" and ckpt["calib"]["world_size"] == 2
    state = ckpt["state_dict"]
    for name, amax in a0.items():
        assert torch.equal(state[f"{name}._amax"], amax), name
    model = build_from_checkpoint(ckpt).eval()
    assert torch.isfinite(model(torch.randn(2, 3, 16, 16))).all()

"""Tiny runs shared by the training tests: synthetic 16x16 images, a few batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtqat.stages.calibrate import CalibrateConfig, calibrate
from trtqat.stages.train import TrainConfig, train_fp32

TINY = {"data": "synthetic", "image_size": 16, "batch_size": 8, "limit_batches": 3,
        "progress": False, "seed": 0, "device": "cpu"}
FP32 = {"model": "resnet18", "epochs": 2, "lr": 0.01, "warmup_epochs": 0.0, **TINY}


@pytest.fixture
def fp32_opts() -> dict:
    """TrainConfig options of the shared FP32 run (without ``out``)."""
    return dict(FP32)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread (``one_thread`` in tests/conftest.py)."""


@pytest.fixture(scope="session")
def fp32_run(tmp_path_factory) -> Path:
    """A finished 2-epoch FP32 run folder."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("fp32") / "run"
    train_fp32(TrainConfig(out=str(out), **FP32))
    torch.set_num_threads(n)
    return out


@pytest.fixture(scope="session")
def ptq_run(fp32_run, tmp_path_factory) -> Path:
    """The FP32 run calibrated with the entropy method."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ptq") / "run"
    calibrate(CalibrateConfig(checkpoint=str(fp32_run / "best.pt"), out=str(out),
                              method="entropy", num_batches=2, limit_batches=3, progress=False,
                              device="cpu"))
    torch.set_num_threads(n)
    return out

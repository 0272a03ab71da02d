"""Fault-injection tests: kills, locks, NaN models, corrupt files and invalid values.

Every failing command must exit 1 with one line and no traceback, and leave the run
folder clean: final files load, nothing stale is left, an old run is intact. The helpers
are in faultlib.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread."""


@pytest.fixture
def tiny(monkeypatch):
    """``trtqat train`` builds the tiny model (tests/faults/tiny.py) instead of resnet18
    (image classifiers are built by their family: ``CNNFamily.build``)."""
    from tiny import tiny_model

    from trtqat.families.cnn import CNNFamily

    monkeypatch.setattr(CNNFamily, "build", lambda self, name, num_classes=None, **_:
                        tiny_model(name, num_classes))


@pytest.fixture
def conv_onnx(tmp_path: Path) -> Path:
    """A tiny ONNX model: Conv + Relu, x[N, 3, 8, 8] (tests/engines/conftest.py)."""
    from engines.conftest import make_conv_model

    return make_conv_model(tmp_path / "conv.onnx")

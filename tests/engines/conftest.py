"""Fixtures for the engine tests: tiny ONNX models, the fake tensorrt and fake cuda-python."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from .fake_tensorrt import make_module

TRT_VERSIONS = {"trt10": "10.16.0.72", "trt11": "11.4.0.106"}


def make_conv_model(path: Path, batch: int | str = "N", unused_initializer: bool = False,
                    seed: int = 0) -> Path:
    """Conv(3->4, 3x3) + Relu on x[batch, 3, 8, 8] -> y[batch, 4, 8, 8] (IR 10, opset 17)."""
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                                rng.standard_normal(108).astype(np.float32))]
    if unused_initializer:
        inits.append(helper.make_tensor("unused_weight", TensorProto.FLOAT, [2], [1.0, 2.0]))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "tiny", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def reference(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the original ONNX through plain ONNX Runtime."""
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


@pytest.fixture
def dynamic_onnx(tmp_path: Path) -> Path:
    return make_conv_model(tmp_path / "dynamic.onnx")


@pytest.fixture
def static_onnx(tmp_path: Path) -> Path:
    return make_conv_model(tmp_path / "static.onnx", batch=1)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch):
    """Install the fake cuda-python; returns its runtime module (state in ``._STATE``)."""
    pkg = importlib.import_module(f"{__package__}.fake_cuda")
    bindings = importlib.import_module(f"{__package__}.fake_cuda.bindings")
    runtime = importlib.import_module(f"{__package__}.fake_cuda.bindings.runtime")
    monkeypatch.setitem(sys.modules, "cuda", pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    runtime._reset()
    return runtime


@pytest.fixture(params=sorted(TRT_VERSIONS), ids=sorted(TRT_VERSIONS))
def fake_trt(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, fake_cuda):
    """The fake tensorrt (TensorRT 10 and 11 flavours) plus the fake cuda-python."""
    module = make_module(TRT_VERSIONS[request.param])
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    return module

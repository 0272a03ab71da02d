"""Fixtures of the Python API tests: a tiny calibrated CNN, its data, a tiny ONNX file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trtqat.quant import QuantDescriptor, collect_stats, compute_amax, quantize
from trtqat.quant.model_ops import QuantConfig


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread (``one_thread`` in tests/conftest.py)."""


@pytest.fixture
def images() -> torch.Tensor:
    """32 random 8x8 RGB images."""
    return torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def tiny_qcnn(images) -> nn.Module:
    """Conv-BN-ReLU x2, pooling, Linear (4 classes): quantized (max calibration) and
    calibrated on ``images``, in eval mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    quantize(model, QuantConfig(quant_desc_input=QuantDescriptor(num_bits=8)))
    collect_stats(model, [images[:16], images[16:]], progress=False)
    compute_amax(model, "max")
    return model.eval()


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> Path:
    """A float ONNX file: ``output = relu(input @ W)``, input ``(batch, 4)``, batch dynamic."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["mm"]),
         helper.make_node("Relu", ["mm"], ["output"])], "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    onnx.save(model, str(path))
    return path

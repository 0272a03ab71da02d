"""The Python API places Q/DQ exactly where the command line does (issue 23's done-when):
ResNet18 through ``trtqat.quantize(..., forward_loop=...)`` + ``trtqat.export_onnx(...,
variant="int8")`` against the calibrate and export stages ``trtqat calibrate`` and ``trtqat
export`` run, on the same model."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
import torch
import torchvision

import trtqat
from trtqat.stages.calibrate import CalibrateConfig, calibrate
from trtqat.stages.export import ExportOptions, export_checkpoint

SIZE, CLASSES = 16, 10


def placement(path) -> Counter:
    """Per compute node: its op and which of its inputs arrive through a DequantizeLinear
    (looking through Transpose/Reshape), plus the number of QuantizeLinear nodes."""
    graph = onnx.load(str(path)).graph
    producer = {o: n for n in graph.node for o in n.output}

    def from_dq(name: str) -> bool:
        node = producer.get(name)
        while node is not None and node.op_type in ("Transpose", "Reshape", "Flatten"):
            node = producer.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    found: Counter = Counter()
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "Constant"):
            found[node.op_type] += 1
        elif node.op_type in ("Conv", "Gemm", "MatMul", "Add", "Concat", "MaxPool",
                              "GlobalAveragePool", "AveragePool"):
            found[(node.op_type, tuple(from_dq(i) for i in node.input if i))] += 1
    return found


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_resnet18_api_placement_equals_the_cli(tmp_path, one_thread):
    torch.manual_seed(0)
    ptq = calibrate(CalibrateConfig(model="resnet18", num_classes=CLASSES, data="synthetic",
                                    image_size=SIZE, batch_size=8, num_batches=2,
                                    limit_batches=2, out=str(tmp_path / "ptq"), progress=False,
                                    device="cpu"))
    cli = export_checkpoint(ExportOptions(checkpoint=str(tmp_path / "ptq" / "best.pt"),
                                          variant="int8", out=str(tmp_path / "cli")),
                            echo=lambda _: None)
    assert ptq.out and cli.results and cli.results[0].passed

    model = torchvision.models.resnet18(num_classes=CLASSES)
    batches = [torch.randn(8, 3, SIZE, SIZE) for _ in range(2)]

    def forward_loop(m):
        for x in batches:
            m(x)

    trtqat.quantize(model, forward_loop=forward_loop)
    api = trtqat.export_onnx(model.eval(), batches[0][:2], tmp_path / "api-int8.onnx",
                             variant="int8")
    assert api.passed
    want, got = placement(cli.results[0].path), placement(api.path)
    assert want["QuantizeLinear"] >= 20  # every conv input and the residual Adds
    assert got == want, (
        f"API-only: {dict(got - want)}; CLI-only: {dict(want - got)}")

"""Issue 24's YOLOv8n check: a YOLOv8n built offline from Ultralytics' yaml, through
``trtqat.quantize(model, forward_loop=...)`` and ``trtqat.export_onnx(..., variant="int8")``
with default options. The INT8 file is read node by node (not through the lint): BatchNorm
folded, every Concat and MaxPool of the backbone and neck with one scale on its inputs and
output, the C2f bottlenecks' residual Adds quantized, the head's prediction convs and DFL
in float on purpose, the batch dynamic although calibration ran with another; then the
lint is clean and the export check scored boxes and scores apart. Small: 64x64 images, 2 calibration batches (the ONNX export itself takes a minute)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
MOVES = ("Reshape", "Identity", "Transpose", "Split", "Resize", "Flatten")  # keep a scale


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("ultralytics")
    import trtqat
    from trtqat.families.detect.ultralytics import build_yolo

    torch.manual_seed(0)
    model = build_yolo("yolov8n.yaml", 80).eval()
    batches = [torch.rand(2, 3, 64, 64) for _ in range(2)]
    trtqat.quantize(model, forward_loop=batches)
    path = tmp_path_factory.mktemp("yolo") / "yolov8n-int8.onnx"
    # validated on another batch size than calibration's: the batch stays dynamic
    result = trtqat.export_onnx(model, batches[0], path, variant="int8",
                                validation_data=[torch.rand(3, 3, 64, 64)])
    return onnx.load(str(path)), result


class Graph:
    """Producers, consumers and Q/DQ scales of an ONNX graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.nodes = list(model.graph.node)
        self.init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in self.nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def _scale(self, node) -> float:
        name = node.input[1]
        value = self.init.get(name)
        if value is None:
            value = numpy_helper.to_array(self.producer[name].attribute[0].t)
        return float(np.asarray(value).reshape(-1)[0])

    def dq_scale(self, tensor: str) -> float | None:
        """The scale of the DequantizeLinear ``tensor`` comes from (through data movement)."""
        node = self.producer.get(tensor)
        while node is not None and node.op_type in MOVES:
            node = self.producer.get(node.input[0])
        return self._scale(node) if node is not None and node.op_type == "DequantizeLinear" \
            else None

    def q_scales(self, tensor: str) -> set:
        """The scales of the QuantizeLinear nodes reading ``tensor`` ('float' for others)."""
        return {self._scale(c) if c.op_type == "QuantizeLinear" else "float"
                for c in self.consumers.get(tensor, [])}

    def of(self, op: str, head: bool = False) -> list:
        """Nodes of type ``op`` outside (or, ``head=True``, inside) the Detect head."""
        return [n for n in self.nodes if n.op_type == op and
                n.name.startswith("model.22") == head]


def test_batchnorm_is_folded_and_the_batch_is_dynamic(exported) -> None:
    model, _ = exported
    assert not [n.name for n in model.graph.node if n.op_type == "BatchNormalization"]
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value  # not the calibration batch (2)


def test_concat_and_maxpool_inputs_and_outputs_share_one_scale(exported) -> None:
    g = Graph(exported[0])
    concats, pools = g.of("Concat"), g.of("MaxPool")
    assert len(concats) == 13 and len(pools) == 3  # 8 C2f, SPPF and 4 neck Concats
    for node in concats + pools:
        scales = {g.dq_scale(i) for i in node.input[:1 if node.op_type == "MaxPool" else None]}
        assert None not in scales and len(scales) == 1, (node.name, scales)
        assert g.q_scales(node.output[0]) == scales, (node.name, g.q_scales(node.output[0]))


def test_c2f_residual_adds_are_quantized(exported) -> None:
    g = Graph(exported[0])
    adds = g.of("Add")
    assert len(adds) == 6  # the bottlenecks of model.2, 4, 6 and 8
    for node in adds:
        assert any(g.dq_scale(i) is not None for i in node.input), node.name


def test_prediction_convs_and_dfl_stay_float_and_the_rest_is_int8(exported) -> None:
    g = Graph(exported[0])
    float_convs = {n.name for n in g.nodes if n.op_type == "Conv"
                   and g.dq_scale(n.input[1]) is None}
    assert float_convs == {*(f"model.22.cv{k}.{i}.2/Conv" for k in (2, 3) for i in range(3)),
                           "model.22.dfl.conv/Conv"}
    dfl = next(t for t in exported[0].graph.initializer if t.name.startswith("model.22.dfl"))
    assert np.array_equal(numpy_helper.to_array(dfl).reshape(-1), np.arange(16))  # 0..15


def test_lint_is_clean_and_the_check_scores_boxes_and_scores_apart(exported) -> None:
    _, result = exported
    assert result.passed, "\n".join(result.lines())
    errors = [f for f in result.lint.findings if f.severity == "error"]
    warnings = [f for f in result.lint.findings if f.severity == "warning"]
    assert not errors and not warnings, [(f.rule, f.node) for f in errors + warnings]
    on_purpose = {f.node for f in result.lint.findings if f.rule == "float-layer"}
    assert len(on_purpose) == 7 and all(n.startswith("model.22.") for n in on_purpose)
    names = [c.name for c in result.checks]
    assert "output 'output0' boxes vs PyTorch fake-quant" in names
    assert "output 'output0' scores vs PyTorch fake-quant" in names


def test_a_detection_model_built_by_ultralytics_keeps_its_head_float(caplog):
    """``DetectionModel("yolov8n.yaml")`` as a user builds it (no trtqat attribute): the
    prediction convs and the DFL conv get no active quantizer, with one NOTE line; marking
    ``trtqat_float_layers = ()`` quantizes them."""
    pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    import trtqat
    from trtqat.quant.model_ops import quantizers

    def active(model, inside: str) -> int:
        return sum(1 for name, q in quantizers(model)
                   if name.startswith(inside) and not q.disabled)

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    with caplog.at_level("WARNING"):
        trtqat.quantize(model)
    assert "Detect head's prediction convs and DFL stay float" in caplog.text
    head = len(model.model) - 1
    for branch in ("cv2", "cv3"):
        for level in range(3):
            assert active(model, f"model.{head}.{branch}.{level}.2.") == 0
            assert active(model, f"model.{head}.{branch}.{level}.0.") > 0  # the rest: INT8
    assert active(model, f"model.{head}.dfl.") == 0
    assert torch.equal(model.model[-1].dfl.conv.weight.flatten(), torch.arange(16.0))
    marked = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    marked.trtqat_float_layers = ()
    trtqat.quantize(marked)
    assert active(marked, f"model.{head}.dfl.") > 0

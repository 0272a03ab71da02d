"""One BatchNorm fold per layer: ``trtqat.export.fold_batchnorm`` folds torch modules before
export, ``fold_batchnorm_nodes`` folds ONNX graph nodes in the ORT Q/DQ re-encoding."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trtqat.engines.ort_qdq_graph import Graph
from trtqat.engines.ort_qdq_rewrite import fold_batchnorm_nodes

PACKAGE = Path(__file__).resolve().parents[2] / "trtqat"


def _conv_bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-127, 128, (3, 2, 1, 1)).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.array([0.01, 0.02, 0.03], np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(3, np.int8), "w_zp"),
        numpy_helper.from_array(np.array([0.1, -0.2, 0.3], np.float32), "bias"),
        numpy_helper.from_array(np.array([1.5, -0.5, 0.8], np.float32), "gamma"),
        numpy_helper.from_array(np.array([0.1, 0.2, -0.3], np.float32), "beta"),
        numpy_helper.from_array(np.array([0.05, -0.1, 0.2], np.float32), "mean"),
        numpy_helper.from_array(np.array([0.9, 1.2, 0.5], np.float32), "var"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], axis=0),
        helper.make_node("Conv", ["x", "w", "bias"], ["c"]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"],
                         epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_graph_fold_keeps_the_outputs() -> None:
    model = _conv_bn_model()
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    before = ReferenceEvaluator(model).run(None, {"x": x})[0]
    g = Graph(model)
    assert fold_batchnorm_nodes(g) == 1
    assert [n.op_type for n in g.model.graph.node] == ["DequantizeLinear", "Conv"]
    after = ReferenceEvaluator(g.model).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_one_batchnorm_fold_per_layer() -> None:
    folds = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("fold_batchnorm"):
                folds.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert folds == {"fold_batchnorm": ["export/fold_bn.py"],
                     "fold_batchnorm_nodes": ["engines/ort_qdq_rewrite.py"]}

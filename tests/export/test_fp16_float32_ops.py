"""fp16 conversion with float32 ops: a family's fp16-sensitive ops (LayerNorm, Softmax) keep
computing in float32 between Casts; everything else is fp16."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.export import convert_to_fp16

D = 8


def _block() -> onnx.ModelProto:
    """x -> MatMul(W) -> LayerNormalization(g, b) -> Softmax -> MatMul(W) -> y, and a graph
    output straight from the Softmax."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "W"),
             numpy_helper.from_array((1 + rng.random(D)).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], name="ln", axis=-1),
             helper.make_node("Softmax", ["n"], ["p"], name="sm", axis=-1),
             helper.make_node("MatMul", ["p", "W"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", D]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def test_float32_ops_run_between_casts_and_keep_their_weights():
    model = _block()
    out = convert_to_fp16(model, float32_ops=("LayerNormalization", "Softmax"))
    onnx.checker.check_model(out, full_check=True)
    prod = _producers(out)
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert types == {"W": TensorProto.FLOAT16, "g": TensorProto.FLOAT, "b": TensorProto.FLOAT}
    ln = next(n for n in out.graph.node if n.op_type == "LayerNormalization")
    sm = next(n for n in out.graph.node if n.op_type == "Softmax")
    cast = prod[ln.input[0]]
    assert cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.FLOAT
    assert sm.input[0] == ln.output[0]  # chained float32 ops pass float32 along, no Cast pair
    value_types = {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info}
    assert value_types[ln.output[0]] == value_types[sm.output[0]] == TensorProto.FLOAT
    assert "n" not in prod  # nobody reads the LayerNorm output in fp16: no Cast back
    assert prod["p"].op_type == "Cast"  # the fp16 MatMul and the graph output read it
    x = np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)
    want, got = _run(model, x), _run(out, x)
    assert all(g.dtype == np.float32 for g in got)  # float32 I/O kept
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=5e-3)


def test_without_float32_ops_everything_is_fp16():
    out = convert_to_fp16(_block())
    assert all(t.data_type == TensorProto.FLOAT16 for t in out.graph.initializer)
    assert sum(n.op_type == "Cast" for n in out.graph.node) == 3  # the I/O casts only


@pytest.mark.parametrize("io", ["float32", "float16"])
def test_graph_inputs_read_by_a_float32_op(io):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, D])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, D])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)])
    out = convert_to_fp16(model, io, float32_ops=("Softmax",))
    onnx.checker.check_model(out, full_check=True)
    xs = np.random.default_rng(2).standard_normal((2, D)).astype(np.float32)
    feed = xs if io == "float32" else xs.astype(np.float16)
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]
                               ).run(None, {"x": feed})[0]
    np.testing.assert_allclose(got.astype(np.float32), _run(model, xs)[0], atol=2e-3)


def test_constant_of_shape_without_a_value_becomes_fp16_zeros():
    # torch.zeros(...) filled by index (Swin's shifted-window mask) exports a ConstantOfShape
    # with no value attribute: float32 zeros, which must become fp16 too
    shape = numpy_helper.from_array(np.array([1, 4], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
             helper.make_node("Add", ["x", "zeros"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    half = convert_to_fp16(model)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    sess = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)

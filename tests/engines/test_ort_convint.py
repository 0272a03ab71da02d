"""Quantized convs whose output stays float (heads feeding a graph output) run as ORT
``ConvInteger`` after the CPU re-encoding (trtqat.engines.ort_qdq_convint), computing what
the Q/DQ model computes."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.engines.hints import HINTS_KEY, ORT_PASSES, EngineHints
from trtqat.engines.ort_qdq import (
    count_compute_nodes,
    cpu_session,
    optimized_model,
    reencode_for_cpu,
)
from trtqat.engines.ort_qdq_convint import integer_float_output_convs
from trtqat.engines.ort_qdq_graph import Graph

from .qdq_nets import CLASSES, SIZE, QDQNet, feeds, make


def _two_heads(group: int) -> onnx.ModelProto:
    """A trunk, a classifier head and a 1x1 conv head returned as a second graph output (a
    graph output gets no quantizer, so ORT runs that conv in float)."""
    def body(net: QDQNet, x: str) -> str:
        trunk = net.node("Relu", [net.conv(x, 3, 8)])
        trunk = net.node("Relu", [net.conv(trunk, 8, 8)])
        net.conv(trunk, 8, CLASSES, k=1, group=group)
        return net.head(trunk, 8)
    _, model = make(body)
    head = [n for n in model.graph.node if n.op_type == "Conv"][-1]
    model.graph.output.append(helper.make_tensor_value_info(
        head.output[0], TensorProto.FLOAT, ["n", CLASSES, SIZE, SIZE]))
    return model


@pytest.mark.parametrize("group", [1, 2])
def test_a_head_conv_runs_integer_and_computes_the_same(group):
    qdq_model = _two_heads(group)
    before = count_compute_nodes(optimized_model(qdq_model, 1))
    assert before["float"].get("Conv", 0) + before["float"].get("FusedConv", 0) == 3
    new, report = reencode_for_cpu(qdq_model, feeds(), threads=1)
    assert report["passes"]["float_output_convs_integer"] == 1
    after = report["compute_nodes"]["after"]
    assert after["integer"]["ConvInteger"] == 1 and after["integer"]["QLinearConv"] == 2
    assert set(after["float"]) == {"Mul", "Add"}  # the rescale and the bias
    # the same re-encoding without this pass: the conv then runs in float on the same integers
    without = copy.deepcopy(qdq_model)
    without.metadata_props.add(key=HINTS_KEY, value=EngineHints(
        ort_rewrites=tuple(p for p in ORT_PASSES if p != "float_output_convs")).to_json())
    reference, _ = reencode_for_cpu(without, feeds(), threads=1)
    feed = feeds(n=1, batch=16, seed=3)[0]
    for want, got in zip(cpu_session(reference, 1).run(None, feed),
                         cpu_session(new, 1).run(None, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_convs_whose_output_is_quantized_or_unsuitable_are_left_alone():
    g = Graph(_two_heads(1))
    head = [n for n in g.graph.node if n.op_type == "Conv"][-1]
    w_dq = g.producer[head.input[1]]
    zp = g.inits[w_dq.input[2]]
    zp.CopyFrom(numpy_helper.from_array(
        np.arange(CLASSES, dtype=np.int8), zp.name))  # per-channel zero-points: no ConvInteger
    assert integer_float_output_convs(g) == 0  # the trunk convs feed Qs (ORT's QLinearConv)
    assert [n.op_type for n in g.graph.node].count("Conv") == 3

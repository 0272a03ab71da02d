"""Narrow convs run in float in the ORT engine (trtqat.engines.ort_qdq_narrow): a conv with
fewer output channels than one integer block on a large feature map (efficientvit's 3 -> 8
stem) keeps the Q/DQ graph's float computation, its HardSwish fused by ORT, instead of a
QLinearConv and an integer HardSwish; wider convs and small feature maps stay integer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from trtqat.engines import ort_qdq_narrow
from trtqat.engines.ort_qdq import (
    count_compute_nodes,
    cpu_session,
    optimized_model,
    reencode_for_cpu,
)

from .qdq_nets import SIZE, QDQNet, feeds, make
from .test_ort_activations import _unoptimised


def stem(act: str):
    """A 3 -> 8 conv and a 8 -> 16 conv, each with a HardSwish (``split``: written as
    ``Mul(x, HardSigmoid(x))``, as ORT's basic optimisation leaves it) or a LeakyRelu."""
    def hswish(net: QDQNet, t: str) -> str:
        if act == "leaky":
            return net.node("LeakyRelu", [t], alpha=0.1)
        if act == "hardswish":
            return net.node("HardSwish", [t])
        return net.node("Mul", [t, net.node("HardSigmoid", [t], alpha=1 / 6, beta=0.5)])

    def body(net: QDQNet, x: str) -> str:
        a = hswish(net, net.conv(x, 3, 8))
        return net.head(hswish(net, net.conv(a, 8, 16, k=1)), 16)
    return body


@pytest.mark.parametrize("act, integer_act", [("hardswish", "QLinearMul"),
                                              ("split", "QLinearMul"),
                                              ("leaky", "QLinearLeakyRelu")])
def test_narrow_conv_runs_float_and_fused_wide_one_integer(monkeypatch, act, integer_act):
    _, qdq_model = make(stem(act))
    check = feeds(n=1, batch=32, seed=5)
    monkeypatch.setattr(ort_qdq_narrow, "MIN_POSITIONS", SIZE * SIZE + 1)  # 16 x 16: too small
    _, report = reencode_for_cpu(qdq_model, None, threads=1, count_nodes=False)
    assert report["passes"]["narrow_convs_float"] == 0
    monkeypatch.setattr(ort_qdq_narrow, "MIN_POSITIONS", SIZE * SIZE)
    new, report = reencode_for_cpu(qdq_model, None, threads=1, check_feeds=check)
    assert report["passes"]["narrow_convs_float"] == 1
    after = count_compute_nodes(optimized_model(new, 1))
    # the stem: one float conv with its HardSwish fused (not re-quantized by ORT per tensor)
    floats = {k: v for k, v in after["float"].items() if k not in ("Conv", "FusedConv")}
    assert sum(after["float"].values()) - sum(floats.values()) == 1 and not floats, after
    assert after["integer"]["QLinearConv"] == 1 and after["integer"][integer_act] == 1
    # as close to the Q/DQ graph's outputs as the fully integer engine (the float conv
    # computes what the Q/DQ graph does; the other layers' rounding dominates what is left)
    feed = check[0]
    want = _unoptimised(qdq_model, feed)
    got = cpu_session(new, 1).run(None, feed)[0]
    monkeypatch.setattr(ort_qdq_narrow, "MIN_POSITIONS", 10 ** 9)
    integer, _ = reencode_for_cpu(qdq_model, None, threads=1, count_nodes=False)
    all_int = cpu_session(integer, 1).run(None, feed)[0]
    assert np.isfinite(got).all()
    assert np.abs(got - want).mean() <= 1.25 * np.abs(all_int - want).mean()
    assert report["agreement"]["top1_agreement"] >= 0.99


def test_float_weights_equal_the_dequantized_ones():
    """The float weights are DequantizeLinear's own values ((w - zp) * scale, float32)."""
    from trtqat.engines.ort_qdq_graph import Graph
    from trtqat.engines.ort_qdq_rewrite import prequantize_weights

    _, qdq_model = make(stem("hardswish"))
    g = Graph(qdq_model)
    assert prequantize_weights(g) >= 2  # int8 weight constants, as trtqat export writes them
    g.reindex()
    dq = next(n for n in g.graph.node if n.op_type == "DequantizeLinear"
              and g.is_const(n.input[0]) and g.const(n.input[0]).ndim == 4)
    probe = onnx.helper.make_model(onnx.helper.make_graph(
        [dq], "dq", [], [onnx.helper.make_tensor_value_info(dq.output[0], 1, None)],
        [g.inits[i] for i in dq.input if i]), opset_imports=qdq_model.opset_import,
        ir_version=qdq_model.ir_version)
    want = cpu_session(probe, 1).run(None, {})[0]
    np.testing.assert_array_equal(ort_qdq_narrow.dequantized(g, dq), want)

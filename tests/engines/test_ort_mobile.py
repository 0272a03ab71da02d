"""CPU re-encoding of the patterns mobile networks are made of (trtqat.engines.ort_qdq_units):
ReLU6 (Clip), HardSwish, squeeze-excite, SiLU, depthwise convs, Split / Concat / channel
shuffle, MaxPool, Resize, AveragePool. Each tiny network checks which kernels ORT runs after
the re-encoding, and that its outputs stay as close to the float model as the Q/DQ model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from trtqat.engines.ort_qdq import (
    count_compute_nodes,
    cpu_session,
    optimized_model,
    reencode_for_cpu,
)
from trtqat.engines.ort_qdq_graph import Graph
from trtqat.engines.ort_u8s8 import exact_weights, u8s8_saturates

from .qdq_nets import QDQNet, feeds, make

AXES = np.array([2, 3], np.int64)


def _relu6(net: QDQNet, t: str) -> str:
    return net.node("Clip", [t, net.const(np.float32(0)), net.const(np.float32(6))])


def _silu(net: QDQNet, t: str) -> str:
    return net.node("Mul", [t, net.node("Sigmoid", [t])])


def mobilenet_v2(net: QDQNet, x: str) -> str:
    """Stem, then two inverted residuals (1x1 expand, ReLU6, depthwise, ReLU6, 1x1 project);
    the second adds its input (float, as torchvision's block does)."""
    def block(t: str) -> str:
        e = _relu6(net, net.conv(t, 8, 16, k=1))
        return net.conv(_relu6(net, net.conv(e, 16, 16, group=16)), 16, 8, k=1)
    b1 = block(_relu6(net, net.conv(x, 3, 8)))
    return net.head(net.node("Add", [b1, block(b1)]), 8)


def mobilenet_v3(net: QDQNet, x: str) -> str:
    """HardSwish after convs, and a squeeze-excite: ReduceMean, conv, Relu, conv,
    HardSigmoid, Mul."""
    h = net.node("HardSwish", [net.conv(x, 3, 8)])
    e = net.node("Relu", [net.conv(h, 8, 16, k=1)])
    d = net.node("HardSwish", [net.conv(e, 16, 16, group=16)])
    s = net.node("ReduceMean", [net.q(d), net.const(AXES)], keepdims=1)
    f = net.node("Relu", [net.conv(s, 16, 8, k=1)])
    gate = net.node("HardSigmoid", [net.conv(f, 8, 16, k=1)], alpha=1 / 6, beta=0.5)
    return net.head(net.conv(net.node("Mul", [gate, d]), 16, 8, k=1), 8)


def efficientnet(net: QDQNet, x: str) -> str:
    """SiLU (Sigmoid * x) everywhere, a squeeze-excite with a Sigmoid gate, a residual Add."""
    a = _silu(net, net.conv(x, 3, 8))
    b = _silu(net, net.conv(a, 8, 8, group=8))
    s = net.node("ReduceMean", [net.q(b), net.const(AXES)], keepdims=1)
    gate = net.node("Sigmoid", [net.conv(_silu(net, net.conv(s, 8, 4, k=1)), 4, 8, k=1)])
    p = net.conv(net.node("Mul", [b, gate]), 8, 8, k=1)
    return net.head(net.node("Add", [p, a]), 8)


def shufflenet(net: QDQNet, x: str) -> str:
    """MaxPool, Split into two branches, Concat, channel shuffle (Reshape, Transpose,
    Reshape)."""
    a = net.node("MaxPool", [net.node("Relu", [net.conv(x, 3, 8)])], kernel_shape=[2, 2],
                 strides=[2, 2])
    x1, x2 = net.node("Split", [a, net.const(np.array([4, 4], np.int64))], outputs=2, axis=1)
    b = net.node("Relu", [net.conv(x2, 4, 4, k=1)])
    b = net.node("Relu", [net.conv(net.conv(b, 4, 4, group=4), 4, 4, k=1)])
    c = net.node("Concat", [x1, b], axis=1)
    r = net.node("Reshape", [c, net.const(np.array([-1, 2, 4, 8, 8], np.int64))])
    t = net.node("Transpose", [r], perm=[0, 2, 1, 3, 4])
    s = net.node("Reshape", [t, net.const(np.array([-1, 8, 8, 8], np.int64))])
    return net.head(net.node("Relu", [net.conv(s, 8, 8)]), 8)


def resize_and_pools(net: QDQNet, x: str) -> str:
    """A strided conv, nearest Resize back up, a conv, AveragePool."""
    a = net.node("Relu", [net.conv(x, 3, 8, stride=2)])
    up = net.node("Resize", [a, "", net.const(np.array([1, 1, 2, 2], np.float32))],
                  mode="nearest")
    b = net.node("AveragePool", [net.node("Relu", [net.conv(up, 8, 8)])], kernel_shape=[2, 2],
                 strides=[2, 2])
    return net.head(net.conv(b, 8, 8), 8)


def _as_exact_kernels_compute(model, u8s8_exact: bool | None):
    """``model`` as a CPU with exact u8s8 kernels (VNNI) computes it: asked to trust the
    kernels on a CPU whose kernels saturate, store the int8 weights as uint8 + 128 (the same
    integers, run on the exact u8u8 kernel)."""
    if u8s8_exact is not True or not u8s8_saturates():
        return model
    g = Graph(onnx.load_from_string(model.SerializeToString()))
    exact_weights(g)
    return g.model


def _reencode(body, u8s8_exact: bool | None = None):
    float_model, qdq_model = make(body)
    new, report = reencode_for_cpu(qdq_model, feeds(), threads=1,
                                   min_top1=0.9 if u8s8_exact is not True else 0.0,
                                   u8s8_exact=u8s8_exact)
    before = count_compute_nodes(optimized_model(qdq_model, 1))
    feed = feeds(n=1, batch=32, seed=5)[0]  # not the calibration inputs
    want = cpu_session(float_model, 1).run(None, feed)[0]
    qdq = cpu_session(qdq_model, 1, "basic").run(None, feed)[0]
    got = cpu_session(_as_exact_kernels_compute(new, u8s8_exact), 1).run(None, feed)[0]
    # the re-encoding stays about as close to the float model as the Q/DQ model itself
    assert np.abs(got - want).max() <= 1.5 * np.abs(qdq - want).max() + 0.01 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9
    return before, report["compute_nodes"]["after"], report


@pytest.mark.parametrize("u8s8_exact, absorbed", [
    (True, "into_uint8_quantizer"),  # VNNI: Q(uint8, 6/255) clips at 6, ORT fuses it
    (False, "integer_clip")])  # u8s8 saturates: Q(uint8, s) then a uint8 Clip at 127 steps
def test_relu6_depthwise_and_residual_run_integer(u8s8_exact, absorbed):
    before, after, report = _reencode(mobilenet_v2, u8s8_exact)
    assert before["float"].get("FusedConv", 0) + before["float"].get("Conv", 0) >= 5
    assert after["integer"]["QLinearConv"] == 7
    assert after["integer"]["QLinearAdd"] == 1 and after["integer"]["QGemm"] == 1
    assert after["float_total"] == 0 and after["quantize_dequantize"] == 1  # the input's Q
    assert report["passes"]["clips_absorbed"] == {absorbed: 5}


def test_hardswish_and_squeeze_excite():
    _, after, _ = _reencode(mobilenet_v3)
    assert after["integer"]["QLinearConv"] == 6
    assert after["integer"]["QLinearGlobalAveragePool"] == 2
    # ORT has no integer HardSwish / HardSigmoid (its quantize_static output runs them in
    # float): each becomes a QLinearAdd of x / 6 and 1/2 into a [0, 1] uint8 grid, and
    # HardSwish a QLinearMul of x by that (trtqat.engines.ort_qdq_act)
    assert after["integer"]["QLinearAdd"] == 3 and after["integer"]["QLinearMul"] == 3
    assert after["float_total"] == 0


def test_silu_and_sigmoid_gate_run_integer():
    _, after, _ = _reencode(efficientnet)
    assert after["integer"]["QLinearConv"] == 5
    assert after["integer"]["QLinearSigmoid"] == 4 and after["integer"]["QLinearMul"] == 4
    assert after["integer"]["QLinearAdd"] == 1
    assert after["float_total"] == 0


def test_split_concat_and_channel_shuffle_stay_integer():
    before, after, _ = _reencode(shufflenet)
    assert after["integer"]["QLinearConv"] == 5 and after["integer"]["QLinearConcat"] == 1
    assert after["integer"].get("NhwcMaxPool", 0) + after["integer"].get("MaxPool", 0) == 1
    assert after["float_total"] == 0 and after["quantize_dequantize"] == 1
    assert after["other"]["Split"] == 1  # on uint8 data: no Q/DQ around it
    assert before["quantize_dequantize"] > 10


def test_resize_and_average_pool_run_on_uint8():
    _, after, _ = _reencode(resize_and_pools)
    assert after["integer"]["QLinearConv"] == 3
    assert after["integer"]["Resize"] == 1 and after["integer"]["QLinearAveragePool"] == 1
    assert after["float_total"] == 0


def _relu6_pair(gain: float):
    def body(net: QDQNet, x: str) -> str:
        a = _relu6(net, net.conv(x, 3, 8, gain=gain))
        return net.head(_relu6(net, net.conv(a, 8, 8, k=1)), 8)
    return body


@pytest.mark.parametrize("u8s8_exact, gain, absorbed", [
    (True, 1.0, "into_uint8_quantizer"),  # ReLU6 reaches 6: a uint8 grid of 6/255
    (True, 0.1, "to_relu"),  # 255 steps stay below 6: a Relu ORT drops
    (False, 1.0, "integer_clip"),  # saturating u8s8: exact, at most 127 steps
    (False, 0.1, "integer_clip")])
def test_relu6_quantizer_choice(u8s8_exact, gain, absorbed):
    """On CPUs whose u8s8 kernels saturate, a ReLU6 keeps its calibrated scale and a uint8
    Clip (exact, 7-bit), so the dense conv reading it keeps int8 weights; elsewhere the Clip
    goes into the uint8 quantizer."""
    _, qdq_model = make(_relu6_pair(gain))
    new, report = reencode_for_cpu(qdq_model, feeds(), threads=1, min_top1=0.9,
                                   u8s8_exact=u8s8_exact)
    assert report["passes"]["clips_absorbed"] == {absorbed: 2}
    assert report["compute_nodes"]["after"]["float_total"] == 0
    inits = {t.name: t.data_type for t in new.graph.initializer}
    producer = {o: n for n in new.graph.node for o in n.output}
    second = producer[[n for n in new.graph.node if n.op_type == "Conv"][1].input[1]]
    assert inits[second.input[0]] == 3  # int8 weights on the 1x1 conv: no u8u8 kernel
    if absorbed == "integer_clip":  # the same integers as the Q/DQ model, up to float rounding
        feed = feeds(n=1, seed=4)[0]
        want = cpu_session(qdq_model, 1, "basic").run(None, feed)[0]
        got = cpu_session(new, 1).run(None, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_without_calibration_inputs_every_unit_gets_a_scale():
    _, qdq_model = make(mobilenet_v2)
    _, report = reencode_for_cpu(qdq_model, None, threads=1)
    added = report["passes"]["output_quantizers_added"]
    assert added["calibrated"] == 0 and added["from_neighbours"] + added["from_clip_bound"] >= 1
    assert report["compute_nodes"]["after"]["float_total"] == 0


@pytest.mark.parametrize("body", [mobilenet_v2, shufflenet])
def test_every_conv_input_is_a_single_quantized_tensor(body):
    """No tensor is quantized twice with different scales after the re-encoding."""
    _, qdq_model = make(body)
    new, _ = reencode_for_cpu(qdq_model, feeds(), threads=1, min_top1=0.9, count_nodes=False)
    sources = [n.input[0] for n in new.graph.node if n.op_type == "QuantizeLinear"]
    assert len(sources) == len(set(sources))

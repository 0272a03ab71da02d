"""Pointwise activations stay integer in the ORT engine (trtqat.engines.ort_qdq_act): the
LeakyRelu, HardSwish and squeeze-excite gate (HardSigmoid, Mul) of a TensorRT-style Q/DQ
graph, which has no quantizer between a conv and its activation, run on ORT's integer
kernels in the engine ``trtqat build --backend ort`` builds (no calibration inputs), and its
outputs stay with the Q/DQ model's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from trtqat.engines import build_engine
from trtqat.engines.ort_qdq import count_compute_nodes

from .qdq_nets import QDQNet, feeds, make
from .test_ort_mobile import AXES

ACTIVATION_OPS = {"LeakyRelu", "HardSigmoid", "HardSwish", "Mul", "Add", "Conv", "FusedConv"}


def csp(net: QDQNet, x: str) -> str:
    """LeakyRelu after every conv: one read through a MaxPool, two joined by a Concat."""
    a = net.node("LeakyRelu", [net.conv(x, 3, 8)], alpha=0.1)
    p = net.node("MaxPool", [a], kernel_shape=[2, 2], strides=[2, 2])
    b = net.node("LeakyRelu", [net.conv(p, 8, 8, k=1)], alpha=0.1)
    c = net.node("LeakyRelu", [net.conv(p, 8, 8)], alpha=0.1)
    cat = net.node("Concat", [b, c], axis=1)
    return net.head(net.node("LeakyRelu", [net.conv(cat, 16, 8, k=1)], alpha=0.1), 8)


def mobilenet_v3(gain: float = 1.0, split: bool = False):
    """HardSwish after convs and a squeeze-excite gate (HardSigmoid, Mul) scaling a
    HardSwish output; ``gain`` < 1 makes the activations shrink from layer to layer (a
    randomly initialised MobileNetV3 ends near 1e-9); ``split``: each HardSwish written as
    ``Mul(x, HardSigmoid(x))``, as ORT's basic optimisation leaves it (efficientvit)."""
    def body(net: QDQNet, x: str) -> str:
        def conv(t: str, cin: int, cout: int, **kw) -> str:
            return net.conv(t, cin, cout, gain=gain, bias=0.1 * gain, **kw)

        def hswish(t: str) -> str:
            if not split:
                return net.node("HardSwish", [t])
            return net.node("Mul", [t, net.node("HardSigmoid", [t], alpha=1 / 6, beta=0.5)])
        h = hswish(conv(x, 3, 8))
        d = hswish(conv(h, 8, 16, k=1))
        s = net.node("ReduceMean", [net.q(d), net.const(AXES)], keepdims=1)
        f = net.node("Relu", [conv(s, 16, 8, k=1)])
        gate = net.node("HardSigmoid", [conv(f, 8, 16, k=1)], alpha=1 / 6, beta=0.5)
        return net.head(conv(net.node("Mul", [gate, d]), 16, 8, k=1), 8)
    return body


def _unoptimised(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


@pytest.mark.parametrize("body, integer_ops", [
    (csp, {"QLinearConv": 4, "QLinearLeakyRelu": 4, "QLinearConcat": 1}),
    (mobilenet_v3(), {"QLinearConv": 5, "QLinearMul": 3, "QLinearAdd": 3}),  # 2 HardSwish, 1 gate
    (mobilenet_v3(0.01), {"QLinearConv": 5, "QLinearMul": 3, "QLinearAdd": 3}),  # vanishing
    (mobilenet_v3(split=True), {"QLinearConv": 5, "QLinearMul": 3, "QLinearAdd": 3}),
], ids=["leaky_relu", "hardswish_se", "hardswish_se_small", "hardswish_split"])
def test_activations_run_integer_in_the_engine(tmp_path, body, integer_ops):
    _, qdq_model = make(body)
    path = tmp_path / "m_int8.onnx"
    onnx.save(qdq_model, path)
    engine = build_engine(path, "ort", threads=1)  # checked on synthetic inputs
    counts = count_compute_nodes(onnx.load_from_string(engine.payload))
    assert not ACTIVATION_OPS & set(counts["float"]), counts["float"]
    assert counts["float_total"] == 0
    for op, n in integer_ops.items():
        assert counts["integer"][op] == n, counts["integer"]
    assert counts["other"].get("Transpose", 0) <= 2  # NHWC from the input's Q to the head

    from trtqat.engines.ort_qdq import cpu_session

    feed = feeds(n=1, batch=32, seed=5)[0]  # not the inputs of the build's check
    want = _unoptimised(qdq_model, feed)
    got = cpu_session(onnx.load_from_string(engine.payload), 1).run(None, feed)[0]
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 0.1 * scale
    margin = np.sort(want, axis=1)[:, -1] - np.sort(want, axis=1)[:, -2]
    decisive = margin > 0.05 * scale
    assert decisive.sum() >= 8
    assert (got.argmax(1) == want.argmax(1))[decisive].mean() >= 0.9


@pytest.mark.parametrize("gain, calibrated", [(1.0, None), (1e-3, None), (1.0, 0.5)])
def test_activation_input_range_follows_the_conv(gain, calibrated):
    """Without calibration inputs the quantizer added before a HardSwish/HardSigmoid spans
    where the activation is not constant ([-3, 3]), narrowed to what the conv can output:
    with small activations a [-3, ...] grid would round every value to zero. Calibrated
    ranges narrow it further."""
    from trtqat.engines.ort_qdq_act import integer_activations
    from trtqat.engines.ort_qdq_graph import Graph
    from trtqat.engines.ort_qdq_rewrite import prequantize_weights

    _, qdq_model = make(mobilenet_v3(gain))
    g = Graph(qdq_model)
    prequantize_weights(g)
    ranges = None if calibrated is None else (lambda names: dict.fromkeys(names, calibrated))
    assert integer_activations(g, ranges) == {"HardSwish": 2, "HardSigmoid": 1}
    spans = []
    for q in (n for n in g.graph.node if n.op_type == "QuantizeLinear"
              and g.producer.get(n.input[0]) is not None
              and g.producer[n.input[0]].op_type == "Conv"
              and g.const(n.input[2]).dtype == np.uint8):  # not the exported int8 ones
        scale, zp = float(g.const(q.input[1])), int(g.const(q.input[2]))
        spans.append((-zp * scale, (255 - zp) * scale))
    assert len(spans) == 3
    if calibrated is not None:
        assert all(-0.51 <= lo and hi <= 0.5 for lo, hi in spans)
    elif gain == 1.0:
        assert -3.05 <= min(lo for lo, _ in spans) <= -3.0  # -3 on the grid, or one step below
    else:
        assert max(hi - lo for lo, hi in spans) < 0.05


@pytest.mark.parametrize("amax, bound, want", [
    (6.0, None, (-3.0, 6.0)),  # below -3 HardSwish is 0; above amax its quantizer clips
    (1e-6, None, (-2e-6, 2e-6)),  # nothing known below 0: as wide as above
    (1e-6, 10.0, (-3.0, 2e-6)),  # the conv may reach -3: exact
    (6.0, 0.5, (-0.5, 0.5)),
    (float("inf"), None, None), (1e-40, None, None)])  # no finite float32 grid
def test_hardswish_input_range(amax, bound, want):
    from trtqat.engines.ort_qdq_act import _hard_range

    got = _hard_range("HardSwish", 1 / 6, 0.5, amax, bound)
    assert got == want if want is None else got == pytest.approx(want, rel=1e-3)

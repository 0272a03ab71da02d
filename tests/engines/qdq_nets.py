"""Tiny TensorRT-style Q/DQ networks built directly in ONNX, for the CPU re-encoding tests.

A network is a function ``body(net, x) -> logits`` written with :class:`QDQNet`'s helpers;
:func:`make` builds it twice with the same random weights: as float to calibrate the
activation quantizers (max of |x| over :func:`feeds`), then with int8 symmetric Q/DQ on
every quantizer point and per-channel int8 weights, as ``trtqat export`` writes them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE, CHANNELS, CLASSES = 16, 3, 6


class QDQNet:
    """Graph builder: ``q`` marks an activation quantizer, ``conv``/``gemm`` take quantized
    inputs and per-channel int8 weights."""

    def __init__(self, amax: list[float] | None) -> None:
        self.rng = np.random.default_rng(11)
        self.amax, self.points, self.k = amax, [], 0
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def init(self, hint: str, value) -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: int = 1, **attrs):
        outs = [self.name(op.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=outs[0], **attrs))
        return outs[0] if outputs == 1 else outs

    def q(self, x: str) -> str:
        """TensorRT's activation quantizer: int8, zero-point 0, amax from calibration."""
        if self.amax is None:
            self.points.append(x)
            return x
        amax = self.amax[self.k]
        self.k += 1
        s, z = self.init("scale", np.float32(max(amax, 1e-6) / 127)), self.init("zp", np.int8(0))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, s, z]), s, z])

    def weight(self, w: np.ndarray) -> str:
        name = self.init("w", w.astype(np.float32))
        if self.amax is None:
            return name
        scale = np.abs(w.reshape(w.shape[0], -1)).max(1) / 127.0
        s = self.init("wscale", scale.astype(np.float32))
        z = self.init("wzp", np.zeros(w.shape[0], np.int8))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [name, s, z], axis=0),
                                              s, z], axis=0)

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1,
             group: int = 1, gain: float = 1.0, bias: float = 0.1) -> str:
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * gain * np.sqrt(2 / fan_in)
        b = self.init("b", (bias * self.rng.standard_normal(cout)).astype(np.float32))
        return self.node("Conv", [self.q(x), self.weight(w), b], kernel_shape=[k, k],
                         strides=[stride, stride], pads=[k // 2] * 4, group=group)

    def const(self, value) -> str:
        return self.init("c", value)

    def head(self, x: str, c: int) -> str:
        """GlobalAveragePool (as ReduceMean), Flatten, quantized Gemm to CLASSES logits."""
        pooled = self.node("ReduceMean", [self.q(x), self.const(np.array([2, 3], np.int64))],
                           keepdims=1)
        flat = self.node("Flatten", [pooled])
        w = self.rng.standard_normal((CLASSES, c)) / np.sqrt(c)
        return self.node("Gemm", [self.q(flat), self.weight(w),
                                  self.const(np.zeros(CLASSES, np.float32))], transB=1)


def feeds(n: int = 3, batch: int = 8, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch, CHANNELS, SIZE, SIZE)).astype(np.float32)}
            for _ in range(n)]


def _model(net: QDQNet, out: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        net.nodes, "qdq_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", CHANNELS, SIZE, SIZE])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["n", CLASSES])], net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def make(body: Callable[[QDQNet, str], str]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``(float model, Q/DQ model)`` of ``body``, the quantizers max-calibrated on feeds()."""
    import onnxruntime as ort

    net = QDQNet(None)
    float_model = _model(net, body(net, "x"))
    probe = copy.deepcopy(float_model)
    names = list(dict.fromkeys(net.points))
    for name in names:
        if name not in {o.name for o in probe.graph.output}:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(probe.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    amax = dict.fromkeys(names, 0.0)
    for feed in feeds():
        for name, value in zip(names, session.run(names, feed)):
            amax[name] = max(amax[name], float(np.abs(value).max()))
    qnet = QDQNet([amax[p] for p in net.points])
    return float_model, _model(qnet, body(qnet, "x"))

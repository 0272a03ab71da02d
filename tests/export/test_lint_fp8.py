"""The lint's FP8 rules, each on a hand-made graph (INT8 graphs keep the INT8 rules)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.export import RULES, lint_model


class G:
    """x[1,4,8,8] in; Q/DQ with int8 or FP8 E4M3 zero points."""

    def __init__(self) -> None:
        self.nodes, self.inits, self.n = [], [], 0

    def name(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.name()
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def zero(self, fmt: str, n: int = 1, per_channel: bool = False) -> str:
        if fmt == "int8":
            return self.const(np.zeros(n) if per_channel else 0, np.int8)
        name = self.name()
        dims = [n] if per_channel else []
        self.inits.append(helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, dims,
                                             bytes(n), raw=True))
        return name

    def op(self, op_type: str, inputs, name: str | None = None, **attrs) -> str:
        out = self.name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=name or f"{op_type}_{out}", **attrs))
        return out

    def qdq(self, x: str, fmt: str = "fp8", scale=0.1, name: str = "act", **attrs) -> str:
        s, z = self.const(scale), self.zero(fmt, np.size(scale), np.ndim(scale) > 0)
        q = self.op("QuantizeLinear", [x, s, z], name=f"{name}/QuantizeLinear", **attrs)
        return self.op("DequantizeLinear", [q, s, z], name=f"{name}/DequantizeLinear", **attrs)

    def weight(self, fmt: str = "fp8", per_channel: bool = True,
               shape: tuple[int, ...] = (32, 32, 3, 3)) -> str:
        n = shape[0] if per_channel else 1
        w = self.name()
        codes = np.random.default_rng(0).integers(0, 0x70, int(np.prod(shape)), np.uint8)
        if fmt == "fp8":
            self.inits.append(helper.make_tensor(w, TensorProto.FLOAT8E4M3FN, list(shape),
                                                 codes.tobytes(), raw=True))
        else:
            self.inits.append(numpy_helper.from_array(codes.astype(np.int8).reshape(shape), w))
        scale = self.const(np.full(n, 0.01) if per_channel else 0.01)
        return self.op("DequantizeLinear", [w, scale, self.zero(fmt, n, per_channel)],
                       name="w/DequantizeLinear", axis=0)

    def conv(self, x: str = "x", fmt: str = "fp8", per_channel: bool = True,
             shape: tuple[int, ...] = (32, 32, 3, 3)) -> str:
        return self.op("Conv", [self.qdq(x, fmt), self.weight(fmt, per_channel, shape)],
                       name="conv/Conv", pads=[1, 1, 1, 1])

    def model(self, out: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, 4, 8, 8])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 8, 8, 8])],
            self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                                 ir_version=9)


def _findings(model: onnx.ModelProto) -> set[tuple[str, str]]:
    return {(f.rule, f.severity) for f in lint_model(model).findings}


def test_an_fp8_conv_with_residual_and_per_tensor_weights_is_clean():
    """FP8 zero points are valid; per-tensor FP8 weights are not a finding (INT8's are)."""
    g = G()
    y = g.conv(per_channel=False)
    model = g.model(g.op("Add", [y, g.qdq("x", name="skip")]))
    onnx.checker.check_model(model)
    assert _findings(model) == set()
    g = G()
    assert _findings(g.model(g.conv(fmt="int8", per_channel=False))) == {
        ("per-tensor-weight", "warning")}


@pytest.mark.parametrize("case, finding", [
    ("fp8-into-pool", ("no-fp8-form", "warning")),
    ("int8-into-pool", set()),
    ("fp8-into-sigmoid", ("no-fp8-form", "warning")),
    ("int8-into-sigmoid", ("no-int8-form", "error")),
    ("mixed", ("mixed-formats", "warning")),
    ("fp8-per-channel-activation", ("activation-per-channel", "error")),
    ("fp8-rgb-stem", ("fp8-small-conv", "warning")),
    ("int8-rgb-stem", set()),
])
def test_fp8_rules(case, finding):
    """An FP8 Q/DQ before an op TensorRT runs in float is a warning (an INT8 one keeps its
    INT8 rule); INT8 and FP8 in one file warn; FP8 activations are per tensor; an FP8 RGB
    stem convolution warns."""
    g = G()
    fmt, _, what = case.partition("-")
    what = what.removeprefix("into-")
    if what == "pool":
        out = g.op("GlobalAveragePool", [g.qdq("x", fmt)])
    elif what == "sigmoid":
        out = g.op("Sigmoid", [g.qdq("x", fmt)])
    elif what == "rgb-stem":  # 3 input channels: no FP8 kernel worth it (INT8: fine)
        out = g.conv(fmt=fmt, shape=(32, 3, 3, 3))
    elif case == "mixed":
        out = g.op("Relu", [g.op("Add", [g.conv(), g.qdq("x", "int8", name="skip")])])
    else:
        out = g.op("Conv", [g.qdq("x", scale=np.full(4, 0.1), axis=1), g.weight()])
    got = _findings(g.model(out))
    assert got == (finding if isinstance(finding, set) else {finding})


def test_fp8_rules_are_documented():
    assert {"no-fp8-form", "mixed-formats", "fp8-small-conv"} <= set(RULES)

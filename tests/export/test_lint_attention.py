"""The Q/DQ lint on attention: activation x activation MatMuls, transposed Linear weights,
float ops (Softmax, LayerNorm, GELU) fed by a DQ, and transformer residual Adds."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtqat.export.lint import lint_model

D, F = 8, 4  # hidden width, Linear output width


class G:
    """A small graph builder: Q/DQ pairs with their own constant scales."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits = [numpy_helper.from_array(np.array(0, np.int8), "zp")]
        self.n = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=f"n{self.n}/{op_type}", **attrs))
        return out

    def const(self, value: np.ndarray) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def qdq(self, x: str, scale: float = 0.05) -> str:
        s = self.const(np.array(scale, np.float32))
        return self.op("DequantizeLinear", self.op("QuantizeLinear", x, s, "zp"), s, "zp")

    def linear_weight(self, axis: int = 0, out: int = F, inp: int = D) -> str:
        """int8 W[out, in] -> DQ (per row) -> Transpose: the exporter's form of nn.Linear."""
        w = self.const(np.ones((out, inp), np.int8))
        n = out if axis == 0 else inp
        dq = self.op("DequantizeLinear", w, self.const(np.full(n, 0.01, np.float32)),
                     self.const(np.zeros(n, np.int8)), axis=axis)
        return self.op("Transpose", dq, perm=[1, 0])

    def model(self, out: str) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", D])
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
        graph = helper.make_graph(self.nodes, "g", [x], [y], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attention(break_operand: str | None = None, weight_axis: int = 0) -> onnx.ModelProto:
    """Linear projections, then softmax(Q.K^T) . V with Q/DQ on every MatMul operand."""
    g = G()
    xq = g.qdq("x")
    q, k, v = (g.op("MatMul", xq, g.linear_weight(weight_axis)) for _ in range(3))
    k_t = g.op("Transpose", k, perm=[0, 2, 1])
    qk = g.op("MatMul", g.qdq(q), k_t if break_operand == "k" else g.qdq(k_t))
    p = g.op("Softmax", qk, axis=-1)
    pv = g.op("MatMul", p if break_operand == "p" else g.qdq(p), g.qdq(v))
    return g.model(pv)


def test_quantized_attention_lints_clean():
    report = lint_model(attention())
    assert report.findings == [], report.lines()


def test_missing_dq_on_an_attention_operand_is_an_error():
    for operand in ("k", "p"):
        report = lint_model(attention(break_operand=operand))
        assert [f.rule for f in report.errors] == ["unquantized-input"], report.lines()
        assert "both operands" in report.errors[0].message
    assert "Softmax" in lint_model(attention(break_operand="p")).errors[0].message


def test_weight_axis_is_checked_through_the_transpose():
    report = lint_model(attention(weight_axis=1))  # per input channel: wrong
    assert {f.rule for f in report.errors} == {"weight-axis"}
    assert len(report.errors) == 3


def test_dq_into_float_ops_is_no_int8_form():
    g = G()
    xq = g.qdq("x")
    g.op("Softmax", xq, axis=-1)
    reshaped = g.op("Reshape", xq, g.const(np.array([0, 0, D], np.int64)))
    ln = g.op("LayerNormalization", reshaped, g.const(np.ones(D, np.float32)),
              g.const(np.zeros(D, np.float32)), axis=-1)
    report = lint_model(g.model(ln))
    flagged = {f.node.split("/")[1]: f.message for f in report.errors
               if f.rule == "no-int8-form"}
    assert set(flagged) == {"Softmax", "LayerNormalization"}  # seen through the Reshape
    assert "after the Softmax" in flagged["Softmax"]


def test_transformer_residual_add_is_not_a_residual_warning():
    def block(after: str) -> onnx.ModelProto:
        g = G()
        h = g.op("MatMul", g.qdq("x"), g.linear_weight())
        h = g.op("MatMul", g.qdq(h), g.linear_weight(out=D, inp=F))
        s = g.op("Add", h, "x")  # residual: MatMul branch + identity
        if after == "LayerNormalization":
            s = g.op(after, s, g.const(np.ones(D, np.float32)),
                     g.const(np.zeros(D, np.float32)), axis=-1)
        else:
            s = g.op(after, s)
        return g.model(s)

    assert lint_model(block("LayerNormalization")).findings == []
    assert lint_model(block("Relu")).rules() == {"residual-add"}  # the CNN rule still fires

"""The TensorRT Q/DQ placement lint: each rule on a hand-made graph, and real exports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.cli import main
from trtqat.export import RULES, lint_model


class G:
    """A tiny graph builder: x[1,4,8,8] in, named tensors, int8 Q/DQ helpers."""

    def __init__(self) -> None:
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, value, dtype=np.float32) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs, name: str | None = None, **attrs) -> str:
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=name or f"{op_type}_{self.n}", **attrs))
        return out

    def qdq(self, x: str, scale=0.1, zp=0, zp_dtype=np.int8, name="act", **attrs) -> str:
        s = scale if isinstance(scale, str) else self.const(scale)
        z = [] if zp is None else [self.const(np.full(np.shape(scale), zp), zp_dtype)]
        q = self.op("QuantizeLinear", [x, s, *z], name=f"{name}/QuantizeLinear", **attrs)
        return self.op("DequantizeLinear", [q, s, *z], name=f"{name}/DequantizeLinear", **attrs)

    def weight(self, shape=(8, 4, 3, 3), axis=0, per_channel=True, zp=0) -> str:
        w = self.const(np.random.default_rng(0).integers(-127, 128, shape), np.int8)
        n = shape[axis] if per_channel else 1
        scale = self.const(np.full(n, 0.01) if per_channel else 0.01)
        z = self.const(np.full(n, zp) if per_channel else zp, np.int8)
        return self.op("DequantizeLinear", [w, scale, z], name="w/DequantizeLinear", axis=axis)

    def model(self, out: str, opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                 ir_version=8)


def conv_block(g: G, x: str = "x", quant_act=True, weight: str | None = None) -> str:
    a = g.qdq(x) if quant_act else x
    w = weight or g.weight()
    return g.op("Conv", [a, w], name="conv/Conv", pads=[1, 1, 1, 1])


def rules(model: onnx.ModelProto, severity: str | None = None) -> set[str]:
    report = lint_model(model)
    return {f.rule for f in report.findings if severity is None or f.severity == severity}


def test_a_good_graph_has_no_findings():
    g = G()
    assert lint_model(g.model(g.op("Relu", [conv_block(g)]))).findings == []


def test_every_rule_is_documented():
    assert {"residual-add", "concat-scales", "no-int8-form", "weight-axis"} <= set(RULES)


def _broken(case: str) -> onnx.ModelProto:
    g = G()
    if case == "unquantized-input":
        return g.model(conv_block(g, quant_act=False))
    if case == "float-layer":
        conv = conv_block(g, quant_act=False, weight=g.const(np.ones((8, 4, 3, 3))))
        return g.model(g.op("Relu", [g.qdq(conv)]))
    if case == "weight-axis":
        return g.model(conv_block(g, weight=g.weight(axis=1)))
    if case == "per-tensor-weight":
        return g.model(conv_block(g, weight=g.weight(per_channel=False)))
    if case == "zero-point":
        return g.model(g.op("Relu", [g.qdq("x", zp=3)]))
    if case == "zero-point-missing":
        return g.model(g.op("Relu", [g.qdq("x", zp=None)]))
    if case == "zero-point-uint8":
        return g.model(g.op("Relu", [g.qdq("x", zp_dtype=np.uint8)]))
    if case == "scale":
        computed = g.op("Mul", [g.const(0.1), g.const(2.0)])
        return g.model(g.op("Relu", [g.qdq("x", scale=computed)]))
    if case == "scale-negative":
        return g.model(g.op("Relu", [g.qdq("x", scale=-0.1)]))
    if case == "activation-per-channel":
        return g.model(g.op("Relu", [g.qdq("x", scale=[0.1, 0.2, 0.1, 0.1], axis=1)]))
    if case == "unpaired-qdq":
        q = g.op("QuantizeLinear", ["x", g.const(0.1), g.const(0, np.int8)], name="q")
        return g.model(g.op("Cast", [q], to=TensorProto.FLOAT))
    if case == "residual-add":
        return g.model(g.op("Add", [conv_block(g), g.op("Relu", ["x"])], name="block/Add"))
    if case == "concat-scales":
        a, b = g.qdq("x", 0.1, name="a"), g.qdq("x", 0.2, name="b")
        return g.model(g.op("Concat", [a, b], axis=1))
    if case == "shared-tensor-scales":
        a, b = g.qdq("x", 0.1, name="a"), g.qdq("x", 0.3, name="b")
        return g.model(g.op("Add", [a, b]))
    if case == "maxpool-scales":
        pooled = g.op("MaxPool", [g.qdq("x", 0.1, name="a")], kernel_shape=[2, 2])
        return g.model(g.op("Relu", [g.qdq(pooled, 0.2, name="b")]))
    if case == "no-int8-form":
        return g.model(g.op("Sigmoid", [g.qdq("x", name="gate._input_quantizer")]))
    if case == "no-qdq":
        return g.model(g.op("Relu", ["x"]))
    if case == "opset":
        return g.model(g.op("Relu", [g.qdq("x")]), opset=12)
    raise AssertionError(case)


@pytest.mark.parametrize("case, rule, severity", [
    ("unquantized-input", "unquantized-input", "error"),
    ("float-layer", "float-layer", "warning"),
    ("weight-axis", "weight-axis", "error"),
    ("per-tensor-weight", "per-tensor-weight", "warning"),
    ("zero-point", "zero-point", "error"),
    ("zero-point-missing", "zero-point", "error"),
    ("zero-point-uint8", "zero-point", "error"),
    ("scale", "scale", "error"),
    ("scale-negative", "scale", "error"),
    ("activation-per-channel", "activation-per-channel", "error"),
    ("unpaired-qdq", "unpaired-qdq", "error"),
    ("residual-add", "residual-add", "warning"),
    ("concat-scales", "concat-scales", "warning"),
    ("shared-tensor-scales", "shared-tensor-scales", "warning"),
    ("maxpool-scales", "maxpool-scales", "warning"),
    ("no-int8-form", "no-int8-form", "error"),
    ("no-qdq", "no-qdq", "error"),
    ("opset", "opset", "error"),
])
def test_each_rule_catches_its_broken_graph(case, rule, severity):
    report = lint_model(_broken(case))
    hits = [f for f in report.findings if f.rule == rule]
    assert hits, report.lines()
    assert all(f.severity == severity for f in hits)
    assert report.ok == (severity == "warning" and not report.errors)
    assert all(f.node for f in hits)  # every finding names a node


def test_no_int8_form_suggests_leaving_the_layer_in_float():
    finding = next(f for f in lint_model(_broken("no-int8-form")).findings)
    assert "Sigmoid" in finding.line() and "--skip-layers gate" in finding.message


def test_weight_axes_of_conv_transpose_and_gemm():
    g = G()
    a = g.qdq("x")
    out = g.op("ConvTranspose", [a, g.weight(shape=(4, 6, 3, 3), axis=1)])
    assert lint_model(g.model(out)).findings == []
    g = G()
    flat = g.op("Flatten", [g.qdq("x")])
    w = g.weight(shape=(256, 10), axis=1)
    assert lint_model(g.model(g.op("Gemm", [flat, w], transB=0))).findings == []
    g = G()
    flat = g.op("Flatten", [g.qdq("x")])
    assert "weight-axis" in rules(g.model(g.op("Gemm", [flat, g.weight((256, 10), axis=0)])))


def test_quantized_residual_add_is_clean():
    g = G()
    out = g.op("Add", [conv_block(g), g.qdq("x", name="residual")], name="block/Add")
    assert "residual-add" not in rules(g.model(out))


def test_add_of_a_conv_output_read_elsewhere_too_is_no_residual_warning():
    # the stem conv feeds the next conv and the shortcut; the other input is a GroupNorm's:
    # no conv output only the Add reads, so TensorRT has no conv + add to fuse
    g = G()
    stem = conv_block(g)
    branch = g.op("InstanceNormalization", [conv_block(g, stem), g.const(np.ones(8)),
                                            g.const(np.zeros(8))])
    assert "residual-add" not in rules(g.model(g.op("Add", [stem, branch], name="b/Add")))


def test_attention_scores_plus_a_position_bias_are_no_residual():
    # Swin: Q.K^T (a MatMul) + a relative position bias gathered from a table -> Softmax
    g = G()
    scores = g.op("MatMul", [g.qdq("x", name="q"), g.qdq("x", name="k")])
    bias = g.op("Unsqueeze", [g.op("Relu", ["x"]), g.const(np.array([0], np.int64))])
    out = g.op("Softmax", [g.op("Add", [scores, bias], name="attn/Add")], axis=-1)
    assert "residual-add" not in rules(g.model(out))


def test_shifted_window_scores_plus_bias_then_mask_are_no_residual():
    # Swin's shifted blocks: scores + position bias, reshaped to the windows, + the shift
    # mask, reshaped back, then the Softmax; the same Add feeding a Relu stays a residual
    def scores_plus_bias(g: G) -> str:
        scores = g.op("MatMul", [g.qdq("x", name="q"), g.qdq("x", name="k")])
        bias = g.op("Unsqueeze", [g.op("Relu", ["x"]), g.const(np.array([0], np.int64))])
        return g.op("Add", [scores, bias], name="attn/Add_1")

    shape = np.array([1, 1, 4, 4], np.int64)
    g = G()
    windows = g.op("Reshape", [scores_plus_bias(g), g.const(shape)])
    mask = g.op("Unsqueeze", [g.op("Sigmoid", ["x"]), g.const(np.array([0], np.int64))])
    masked = g.op("Reshape", [g.op("Add", [windows, mask], name="attn/Add_2"), g.const(shape)])
    assert "residual-add" not in rules(g.model(g.op("Softmax", [masked], axis=-1)))
    g = G()
    assert "residual-add" in rules(g.model(g.op("Relu", [scores_plus_bias(g)])))


def test_exported_resnet18_is_clean(resnet18_int8):
    report = lint_model(resnet18_int8)
    assert report.findings == [], report.lines()


def test_exported_resnet50_is_clean(resnet50_int8):
    report = lint_model(resnet50_int8)
    assert report.findings == [], report.lines()


def test_exported_mobilenet_v2_warns_on_unquantized_residuals(mobilenet_v2_int8):
    report = lint_model(mobilenet_v2_int8)
    assert report.ok, report.lines()
    assert report.rules() == {"residual-add"}
    assert len(report.warnings) == 10  # the InvertedResidual blocks with a skip connection


def test_cli_lint(resnet18_int8, tmp_path, capsys):
    assert main(["lint", str(resnet18_int8)]) == 0
    assert "0 error(s), 0 warning(s)" in capsys.readouterr().out
    broken = tmp_path / "broken.onnx"
    onnx.save(_broken("unquantized-input"), broken)
    assert main(["lint", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "[unquantized-input] conv/Conv:" in out and "1 error(s)" in out
    warn = tmp_path / "warn.onnx"
    onnx.save(_broken("residual-add"), warn)
    assert main(["lint", str(warn)]) == 0
    assert main(["lint", "--strict", str(warn)]) == 1
    capsys.readouterr()
    assert main(["lint", str(tmp_path / "missing.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtqat lint: error:") and "\n" not in err

"""export_onnx: variants, Q/DQ form, numeric checks, batch handling, errors."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from export_testlib import batches, make_tiny
from onnx import TensorProto, numpy_helper

from trtqat.export import Exporter, ExportError, ValidationError, export_onnx
from trtqat.export import validate as val
from trtqat.export._graph import GraphIndex, attr


def _run(path, x: np.ndarray) -> np.ndarray:
    session = val.ort_session(path)
    name = session.get_inputs()[0].name
    return session.run(None, {name: x})[0]


def test_every_variant_passes_its_checks(tiny_exports):
    for variant, result in tiny_exports.items():
        assert result.passed, (variant, result.lines())
        assert result.path.is_file()
        names = [c.name for c in result.checks]
        assert names[0] == "onnx.checker"
        assert any(n.startswith("output 'output'") for n in names)
        assert any(n.startswith("top-1 agreement") for n in names)
        assert (result.lint is not None) == variant.startswith("int8")
    assert not list(tiny_exports["int8"].path.parent.glob(".*.tmp"))


def test_int8_graph_is_tensorrt_qdq(tiny_exports, tiny_q):
    model = onnx.load(tiny_exports["int8"].path)
    g = GraphIndex(model.graph)
    assert model.opset_import[0].version == 17
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq
    for node in qdq:
        assert node.input[1] in g.initializers and node.input[2] in g.initializers
        zp = g.constant(node.input[2])
        assert zp.dtype == np.int8 and not zp.any()
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(convs) == 4
    for conv in convs:
        w_dq = g.produced_by(conv.input[1], "DequantizeLinear")
        assert w_dq is not None and g.produced_by(conv.input[0], "DequantizeLinear")
        weight = g.constant(w_dq.input[0])
        assert weight.dtype == np.int8 and np.abs(weight).max() <= 127  # max-calibrated: never -128
        assert attr(w_dq, "axis") == 0 and g.constant(w_dq.input[1]).size == weight.shape[0]
    # the stem's input quantizer: scale = amax / 127, per tensor
    stem = g.produced_by(convs[0].input[0], "DequantizeLinear")
    amax = tiny_q.conv1._input_quantizer.amax
    assert np.isclose(g.constant(stem.input[1]), amax.item() / 127, rtol=1e-6)
    # residual Add: the identity input is dequantized
    add = next(n for n in model.graph.node if n.op_type == "Add")
    assert any(g.produced_by(i, "DequantizeLinear") for i in add.input)
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    assert {p.key: p.value for p in model.metadata_props}["trtqat.variant"] == "int8"


def test_int8_weight_codes_match_pytorch(tiny_exports, tiny_q):
    from trtqat.export.fold_bn import fold_batchnorm

    model = onnx.load(tiny_exports["int8"].path)
    g = GraphIndex(model.graph)
    folded = fold_batchnorm(tiny_q)
    q = folded.conv2._weight_quantizer
    codes = torch.round(folded.conv2.weight.detach() / (q.amax / 127)).clamp(-127, 127)
    conv = next(n for n in model.graph.node if n.name == "conv2/Conv")
    onnx_codes = g.constant(g.producer[conv.input[1]].input[0])
    assert np.array_equal(onnx_codes, codes.numpy().astype(np.int8))


def test_fp16_variants_compute_in_fp16_with_fp32_io(tiny_exports):
    for variant in ("fp16", "int8-fp16"):
        model = onnx.load(tiny_exports[variant].path)
        floats = [t for t in model.graph.initializer
                  if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)]
        assert floats and all(t.data_type == TensorProto.FLOAT16 for t in floats)
        assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
        assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
        assert model.graph.node[0].op_type == "Cast" and model.graph.node[-1].op_type == "Cast"
    assert onnx.load(tiny_exports["int8-fp16"].path).opset_import[0].version == 19


def test_dynamic_batch_runs_any_batch(tiny_exports):
    model = onnx.load(tiny_exports["int8"].path)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    for n in (1, 5):
        out = _run(tiny_exports["int8"].path, np.zeros((n, 3, 16, 16), np.float32))
        assert out.shape == (n, 10)


def test_fixed_batch_io_fp16_and_opset_13(tmp_path, tiny_q):
    x = batches(1, batch=3, seed=1)[0]
    exporter = Exporter(tiny_q, x, dynamic_batch=False,
                        validation_data=[(b,) for b in batches(2, batch=5, seed=3)])
    result = exporter.export(tmp_path / "fixed.onnx", "fp16", 13, io_dtype="fp16")
    assert result.passed and result.opset == 13
    model = onnx.load(result.path)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [3, 3, 16, 16]
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert model.opset_import[0].version == 13
    # the 10 validation rows were re-chunked into batches of 3 (the last one padded);
    # top-1 counts only them, not the random example inputs
    assert "10 samples" in next(c.detail for c in result.checks if "top-1" in c.name)


def test_export_is_quiet(tmp_path, capfd, tiny_q):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_onnx(tiny_q, batches(1, batch=2)[0], tmp_path / "q.onnx", "fp32")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert not caught


def test_failed_check_keeps_no_file(tmp_path, tiny_q, monkeypatch):
    monkeypatch.setitem(val.REL_TOL, "fp32", 0.0)
    monkeypatch.setattr(val.crit, "FP32_FLOOR_MARGIN", 0.0)  # nor PyTorch's own error
    target = tmp_path / "fail.onnx"
    with pytest.raises(ValidationError, match="fail.onnx failed") as info:
        export_onnx(tiny_q, batches(1, batch=2)[0], target, "fp32")
    assert not list(tmp_path.iterdir())
    assert any(line.startswith("FAIL") for line in info.value.result.lines())


def test_wrong_scale_is_caught(tmp_path, tiny_q, monkeypatch):
    """A Q/DQ scale off by 50% on one layer fails the Q/DQ inventory."""
    from trtqat.export import onnx_export

    original = onnx_export.quantize_weights

    def corrupt(model, **kw):
        for node in model.graph.node:
            if node.name == "conv2._input_quantizer/DequantizeLinear":
                for init in model.graph.initializer:
                    if init.name == node.input[1]:
                        value = numpy_helper.to_array(init) * 1.5
                        init.CopyFrom(numpy_helper.from_array(value, init.name))
        return original(model, **kw)

    monkeypatch.setattr(onnx_export, "quantize_weights", corrupt)
    with pytest.raises(ValidationError, match=r"Q/DQ vs quantizers: conv2._input_quantizer.* scale"):
        export_onnx(tiny_q, batches(1, batch=2)[0], tmp_path / "bad.onnx", "int8",
                    validation_data=[(x,) for x in batches(2, seed=4)])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("state, message", [
    ("missing", "is not calibrated"),
    ("nan", "NaN"),
    ("zero", "amax 0"),
])
def test_uncalibrated_quantizer_names_the_module(tmp_path, state, message):
    model = make_tiny(calibrated=state != "missing")
    q = model.conv2._input_quantizer
    if state == "nan":
        q._amax.fill_(float("nan"))
    elif state == "zero":
        q._amax.zero_()
    with pytest.raises(ExportError, match=message) as info:
        export_onnx(model, batches(1)[0], tmp_path / "m.onnx", "int8")
    text = str(info.value)
    assert "'conv1._input_quantizer'" in text if state == "missing" else "conv2" in text
    assert "\n" not in text and not list(tmp_path.iterdir())


def test_float_model_has_no_int8_form(tmp_path):
    model = make_tiny(quantized=False)
    with pytest.raises(ExportError, match="trtqat calibrate"):
        export_onnx(model, batches(1)[0], tmp_path / "m.onnx", "int8")


def test_unwritable_output_folder(tmp_path, tiny_q):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ExportError, match="cannot write to output folder"):
        export_onnx(tiny_q, batches(1)[0], blocker / "sub" / "m.onnx", "fp32")


def test_op_without_int8_form_is_left_in_float_with_a_note(tmp_path):
    """A quantizer feeding an op with no INT8 form (here Sigmoid) is disabled automatically:
    the export passes, says so, and the lint records the layer as float on purpose."""
    from export_testlib import MAX_CALIB

    from trtqat.quant import TensorQuantizer, collect_stats, compute_amax, quantize
    from trtqat.quant.model_ops import QuantConfig, name_quantizers

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.gate = torch.nn.Module()
            self.gate._input_quantizer = TensorQuantizer(MAX_CALIB)

        def forward(self, x):
            return torch.sigmoid(self.gate._input_quantizer(self.conv(x)))

    model = quantize(Gate(), QuantConfig(quant_desc_input=MAX_CALIB)).eval()
    name_quantizers(model)
    collect_stats(model, [torch.randn(2, 3, 8, 8)], progress=False)
    compute_amax(model)
    result = export_onnx(model, torch.randn(2, 3, 8, 8), tmp_path / "g.onnx", "int8")
    assert result.passed
    assert any("left in float automatically" in n and "gate" in n for n in result.notes)
    assert any(line.startswith("NOTE") for line in result.lines())
    graph = onnx.load(tmp_path / "g.onnx").graph
    assert not [n for n in graph.node if n.name.startswith("gate.")]
    assert any(n.name.startswith("conv._input_quantizer") for n in graph.node)

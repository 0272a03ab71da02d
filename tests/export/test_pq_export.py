"""Export safety for pytorch-quantization code: plain torch.onnx.export writes Q/DQ (or
raises), and an uncalibrated model is refused in one line."""

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import trtqat
from trtqat import nn as quant_nn
from trtqat.errors import QuantizerStateError
from trtqat.export import ExportError
from trtqat.export.calibrated import refuse_uncalibrated
from trtqat.quant import export_mode


def _model(calibrated: bool = True) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), nn.ReLU()).eval()
    if calibrated:
        m[0].input_quantizer.amax = 2.0
        m[0].weight_quantizer.amax = m[0].weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)
    return m


@pytest.fixture
def fb_fake_quant():
    quant_nn.TensorQuantizer.use_fb_fake_quant = True
    yield
    quant_nn.TensorQuantizer.use_fb_fake_quant = False


@pytest.mark.parametrize("dynamo", [True, False])
def test_plain_torch_onnx_export_writes_qdq(tmp_path, fb_fake_quant, dynamo):
    model, x = _model(), torch.randn(1, 3, 8, 8) * 3
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo, opset_version=18 if dynamo else 17)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 2
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {
        ort.InferenceSession(str(path)).get_inputs()[0].name: x.numpy()})[0]
    quant_nn.TensorQuantizer.use_fb_fake_quant = False
    with torch.no_grad():
        ref = model(x).numpy()  # full range in PyTorch = the ONNX saturation at -128
    assert abs(got - ref).max() < 1e-4


@pytest.mark.parametrize("dynamo", [False, True])
def test_plain_export_of_an_uncalibrated_model_warns_and_works(tmp_path, dynamo):
    """pytorch-quantization programs export before calibrating (to find graph rules): the
    plain torch idiom warns and uses the example's range; trtqat's own export refuses."""
    model, x = _model(calibrated=False), torch.randn(1, 3, 8, 8)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo,
                          opset_version=18 if dynamo else 13)
    assert any("has no amax (never calibrated)" in str(w.message) for w in caught)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") == 2
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        ref = model(x).numpy()  # the example's own range, as in the file
    assert abs(got - ref).max() < 1e-4
    with pytest.raises(QuantizerStateError, match=r"quantizer '0\._input_quantizer': has no "
                                                  "amax"), export_mode.enabled():
        model(x)


def test_enable_onnx_export_of_an_uncalibrated_model_warns_and_works(tmp_path):
    model, x = _model(calibrated=False), torch.randn(1, 3, 8, 8)
    path = tmp_path / "m.onnx"
    with trtqat.enable_onnx_export(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=13)
    assert any("has no amax (never calibrated)" in str(w.message) for w in caught)
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count("QuantizeLinear") == 2


def test_uncalibrated_activation_quantizers_are_refused_in_one_line():
    model = _model(calibrated=False)
    with pytest.raises(ExportError, match=r"^activation quantizer '0\._input_quantizer' is not "
                                          r"calibrated \(amax is missing\): run") as info:
        refuse_uncalibrated(model)
    assert "\n" not in str(info.value)
    model[0].input_quantizer.amax = 1.0
    refuse_uncalibrated(model)  # only activations here; check_quantizers covers weights
    model[0].input_quantizer.disable()
    refuse_uncalibrated(_model(calibrated=True))


def test_enable_onnx_export_context_writes_qdq(tmp_path):
    import trtqat

    model, x = _model(), torch.randn(1, 3, 8, 8)
    path = tmp_path / "ctx.onnx"
    with trtqat.enable_onnx_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") == 2


def test_folded_int8_weights_keep_minus_128(tmp_path):
    """A weight range calibrated below max|w| saturates at -128, in PyTorch and in the file."""
    from trtqat.export import export_onnx

    model = _model()
    w = model[0].weight
    with torch.no_grad():
        w[0, 0, 0, 0] = -2 * w.abs().max()  # beyond the (max over the rest) weight range
    model[0].weight_quantizer.amax = w.detach().abs().amax(dim=(1, 2, 3), keepdim=True) / 2
    result = export_onnx(model, torch.randn(2, 3, 8, 8), tmp_path / "w.onnx", "int8", fold_bn=False)
    assert result.passed
    graph = onnx.load(str(tmp_path / "w.onnx")).graph
    codes = [onnx.numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith("_int8")]
    assert codes and codes[0].min() == -128


def test_qdq_inventory_allows_fp16_rounding_in_fp16_variants_only(tmp_path):
    """A scale off by fp16's rounding (0.004391 for 0.004389, as an int8-fp16 export of a
    MobileNetV2 showed) is rounding in an fp16 variant and a wrong scale in an int8 one."""
    from onnx import numpy_helper

    from trtqat.export.qdq_check import check_qdq_inventory

    model, path = _model(), tmp_path / "m.onnx"
    trtqat.export_onnx(model, torch.randn(1, 3, 8, 8), path, "int8", validate=False)
    graph = onnx.load(str(path))
    assert check_qdq_inventory(graph, model).passed
    dq = [n for n in graph.graph.node if n.op_type == "DequantizeLinear"][0]
    for init in graph.graph.initializer:
        if init.name == dq.input[1]:
            off = numpy_helper.to_array(init) * np.float32(1 + 4.6e-4)
            init.CopyFrom(numpy_helper.from_array(off.astype(np.float32), init.name))
    assert not check_qdq_inventory(graph, model).passed
    assert check_qdq_inventory(graph, model, fp16=True).passed

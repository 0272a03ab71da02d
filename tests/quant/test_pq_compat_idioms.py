"""pytorch-quantization idioms of public programs (YOLOv7 QAT, plotting utilities, TorchScript
export, compiled training) with the package renamed to trtqat."""

import io
import subprocess
import sys
import warnings

import onnx
import onnxruntime as ort
import pytest
import torch
from catalogue import SmallNet
from torch import nn

import trtqat
from trtqat import calib, quant_modules
from trtqat import nn as quant_nn
from trtqat.errors import CalibrationError
from trtqat.nn.modules import _utils
from trtqat.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor


def _quant_net() -> nn.Module:
    with quant_modules.initialized():
        return SmallNet().eval()


def test_default_quant_map_drives_yolov7_style_replacement():
    """YOLOv7's quantize.py maps float classes by id through _DEFAULT_QUANT_MAP and extends
    it with its own ``_quant_entry``."""
    module_dict = {id(getattr(e.orig_mod, e.mod_name)): e.replace_mod
                   for e in quant_modules._DEFAULT_QUANT_MAP}
    model = SmallNet()
    for name, child in list(model.named_children()):
        if id(type(child)) in module_dict:
            setattr(model, name, module_dict[id(type(child))].from_float(child))
    assert isinstance(model.conv, quant_nn.QuantConv2d) and isinstance(model.fc, quant_nn.QuantLinear)

    class Concat(nn.Module):
        pass

    class QuantConcat(Concat):
        pass

    holder = type("common", (), {"Concat": Concat})
    entry = quant_modules._quant_entry(holder, "Concat", QuantConcat)
    assert (entry.orig_mod, entry.mod_name, entry.replace_mod) == (holder, "Concat", QuantConcat)
    quant_modules._DEFAULT_QUANT_MAP.append(entry)
    try:
        with quant_modules.initialized():
            assert holder.Concat is QuantConcat
        assert holder.Concat is Concat
    finally:
        quant_modules._DEFAULT_QUANT_MAP.remove(entry)


def test_quant_mixin_and_quant_input_mixin_are_unrelated():
    assert not issubclass(_utils.QuantMixin, _utils.QuantInputMixin)
    assert not issubclass(_utils.QuantInputMixin, _utils.QuantMixin)
    conv, pool = quant_nn.QuantConv2d(3, 3, 1), quant_nn.QuantAvgPool2d(2)
    assert isinstance(conv, _utils.QuantMixin) and not isinstance(conv, _utils.QuantInputMixin)
    assert isinstance(pool, _utils.QuantInputMixin) and not isinstance(pool, _utils.QuantMixin)
    # the class default set on QuantMixin reaches the weighted layers only
    old = _utils.QuantMixin.default_quant_desc_input
    _utils.QuantMixin.set_default_quant_desc_input(QuantDescriptor(num_bits=6))
    try:
        assert quant_nn.QuantLinear(2, 2).input_quantizer.num_bits == 6
        assert quant_nn.QuantAvgPool2d(2).input_quantizer.num_bits == 8
    finally:
        _utils.QuantMixin.default_quant_desc_input = old


def test_quant_classes_are_written_out_in_the_source():
    import inspect

    from trtqat.quant import modules

    source = inspect.getsource(modules)
    for cls in modules.FLOAT_TO_QUANT.values():
        assert f"class {cls.__name__}(" in source
        assert cls.__module__ == "trtqat.quant.modules" and cls.__qualname__ == cls.__name__
    assert "class QuantMaxPool2d(" in source and "class QuantInstanceNorm3d(" in source


def test_subpackages_are_attributes_after_import_trtqat():
    code = ("import trtqat; print(trtqat.utils.reduce_amax.__name__, "
            "trtqat.calib.MaxCalibrator.__name__, trtqat.tensor_quant.QuantDescriptor.__name__,"
            " trtqat.nn.QuantConv2d.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["reduce_amax", "MaxCalibrator", "QuantDescriptor", "QuantConv2d"]


def test_histogram_calibrator_exposes_calib_hist_and_bin_edges():
    cal = calib.HistogramCalibrator(8, None, False, num_bins=64)
    assert cal._calib_hist is None and cal._calib_bin_edges is None
    x = torch.linspace(-3, 3, 1001)
    cal.collect(x)
    hist, edges = cal._calib_hist, cal._calib_bin_edges
    assert hist.shape == (64,) and edges.shape == (65,)
    assert float(hist.sum()) == x.numel()
    assert float(edges[0]) == 0 and float(edges[-1]) == pytest.approx(3.0)


def _per_tensor_net(calibrated: bool) -> nn.Module:
    olds = (quant_nn.QuantConv2d.default_quant_desc_weight,
            quant_nn.QuantLinear.default_quant_desc_weight)
    quant_nn.QuantConv2d.set_default_quant_desc_weight(QUANT_DESC_8BIT_PER_TENSOR)
    quant_nn.QuantLinear.set_default_quant_desc_weight(QUANT_DESC_8BIT_PER_TENSOR)
    try:
        model = _quant_net()
    finally:
        quant_nn.QuantConv2d.default_quant_desc_weight = olds[0]
        quant_nn.QuantLinear.default_quant_desc_weight = olds[1]
    if calibrated:
        for module in model.modules():
            if isinstance(module, quant_nn.TensorQuantizer):
                module.amax = 2.5
    return model


@pytest.mark.parametrize("opset", [10, 11, 12, 13])
def test_torchscript_export_of_per_tensor_quantizers_writes_constant_scales(opset):
    model, x = _per_tensor_net(calibrated=True), torch.randn(2, 3, 8, 8)
    quant_nn.TensorQuantizer.use_fb_fake_quant = True
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), buf, opset_version=opset, dynamo=False)
    finally:
        quant_nn.TensorQuantizer.use_fb_fake_quant = False
    graph = onnx.load_from_string(buf.getvalue()).graph
    producers = {out: n.op_type for n in graph.node for out in n.output}
    inits = {i.name for i in graph.initializer}
    qs = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert len(qs) == 5  # conv input + weight, pool input, fc input + weight
    for node in qs:  # the scale is a constant, not computed from an amax buffer
        assert producers.get(node.input[1], "initializer") in ("Constant", "initializer")
        assert node.input[1] in inits or producers[node.input[1]] == "Constant"
    opts = ort.SessionOptions()  # ORT's own Q/DQ fusions emit opset-11 ops into opset 10
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        ref = model(x).numpy()
    assert abs(got - ref).max() < 1e-4


def test_errors_of_a_quantizer_built_under_initialize_name_it():
    model = _quant_net()
    with pytest.raises(CalibrationError, match=r"^quantizer 'fc\._input_quantizer': "):
        model.fc.input_quantizer.load_calib_amax()
    with pytest.raises(ValueError, match=r"^quantizer 'conv\._weight_quantizer': amax contains"):
        model.conv.weight_quantizer.amax = float("nan")
    assert quant_nn.TensorQuantizer()._label() == "TensorQuantizer"  # held by no model


def test_a_quantizer_is_named_in_the_users_model_not_in_torch_exports_wrapper():
    """torch.export holds the traced model as ``_export_root`` of a wrapper while it traces;
    a name found then is cached, so it must be the user's name, not the wrapper's."""
    model = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3))
    wrapper = nn.Module()
    wrapper._export_root = model  # what torch.export.export builds around the model
    assert model[0].input_quantizer._label() == "quantizer '0._input_quantizer'"
    del wrapper


def test_compiled_before_any_eager_forward_has_no_graph_break(monkeypatch):
    from trtqat.quant import functional

    monkeypatch.setattr(functional, "_onnx_flags", [])  # as in a fresh process
    model = _per_tensor_net(calibrated=True).train()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explain = torch._dynamo.explain(model)(torch.randn(2, 3, 8, 8))
    assert explain.graph_break_count == 0, explain.break_reasons
    assert trtqat.quant.export_mode.active() is False


def test_building_a_cli_model_leaves_the_quant_classes_defaults_inherited():
    """``build_model(quantized=True)`` (what ``trtqat calibrate`` builds) sets the classes'
    input descriptors only while it builds: afterwards QuantLinear inherits QuantMixin's
    again, so a later ``QuantMixin.set_default_quant_desc_input`` reaches it."""
    from trtqat.families.cnn.models import build_model

    build_model("resnet18", 10, quantized=True)
    assert "default_quant_desc_input" not in quant_nn.QuantLinear.__dict__
    assert "default_quant_desc_input" not in quant_nn.QuantAvgPool2d.__dict__

"""pytorch-quantization programs, written as its users write them, with only the package
name changed: each test is one idiom from the tutorial, the examples or user code."""

import io

import numpy as np
import pytest
import torch
from catalogue import SmallNet
from torch import nn

from trtqat import calib, quant_modules
from trtqat import nn as quant_nn
from trtqat.tensor_quant import QuantDescriptor


def _quant_net():
    quant_modules.initialize()
    try:
        return SmallNet()
    finally:
        quant_modules.deactivate()


def _collect_stats(model, batches):
    for _, module in model.named_modules():
        if isinstance(module, quant_nn.TensorQuantizer):
            if module._calibrator is not None:
                module.disable_quant()
                module.enable_calib()
            else:
                module.disable()
    with torch.no_grad():
        for x in batches:
            model(x)
    for _, module in model.named_modules():
        if isinstance(module, quant_nn.TensorQuantizer):
            if module._calibrator is not None:
                module.enable_quant()
                module.disable_calib()
            else:
                module.enable()


def _compute_amax(model, **kwargs):
    for _, module in model.named_modules():
        if isinstance(module, quant_nn.TensorQuantizer) and module._calibrator is not None:
            if isinstance(module._calibrator, calib.MaxCalibrator):
                module.load_calib_amax(strict=False)
            else:
                module.load_calib_amax(strict=False, **kwargs)


BATCHES = [torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]


def test_load_calib_amax_strict_false_skips_a_quantizer_that_saw_no_data(caplog):
    model = _quant_net().eval()
    model.fc._input_quantizer.disable()  # a skipped layer: its calibrator never sees data
    _collect_stats(model, BATCHES)
    _compute_amax(model)  # user code passes strict=False for exactly this case
    assert model.fc._input_quantizer.amax is None
    assert "collected no data" in caplog.text
    assert float(model.conv._input_quantizer.amax) == pytest.approx(
        max(float(x.abs().max()) for x in BATCHES))
    assert model.conv._weight_quantizer.amax.shape == (4, 1, 1, 1)
    with pytest.raises(RuntimeError, match="collected no data"):
        model.fc._input_quantizer.load_calib_amax()  # strict (the default) still raises


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter, as pq users call it
def test_tutorial_flow_histogram_calibrate_reload_and_export():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    saved = quant_nn.QuantConv2d.default_quant_desc_input
    quant_nn.QuantConv2d.set_default_quant_desc_input(QuantDescriptor(calib_method="histogram"))
    try:
        model = _quant_net().eval()
        fresh = _quant_net().eval()
    finally:
        quant_nn.QuantConv2d.set_default_quant_desc_input(saved)
    assert isinstance(model.conv._input_quantizer._calibrator, calib.HistogramCalibrator)
    _collect_stats(model, BATCHES)
    _compute_amax(model, method="percentile", percentile=99.99)
    for method in ("mse", "entropy"):
        model.conv._input_quantizer.load_calib_amax(method)
        assert 0 < float(model.conv._input_quantizer.amax) <= float(BATCHES[0].abs().max()) + 1
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    with torch.no_grad():
        torch.testing.assert_close(fresh(BATCHES[0]), model(BATCHES[0]), rtol=0, atol=0)
    path = io.BytesIO()
    quant_nn.TensorQuantizer.use_fb_fake_quant = True
    try:
        torch.onnx.export(fresh, BATCHES[0], path, opset_version=13, dynamo=False)
    finally:
        quant_nn.TensorQuantizer.use_fb_fake_quant = False
    graph = onnx.load_from_string(path.getvalue())
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("QuantizeLinear") == ops.count("DequantizeLinear") == 5
    sess = ort.InferenceSession(path.getvalue(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: BATCHES[1].numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(out, fresh(BATCHES[1]).numpy(), atol=1e-5)


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True, "batch_first": True}])
def test_quant_lstm_loads_float_weights_and_matches_lstm_when_disabled(kwargs):
    torch.manual_seed(0)
    ref = nn.LSTM(5, 6, **kwargs)
    lstm = quant_nn.QuantLSTM(5, 6, **kwargs)
    lstm.load_state_dict(ref.state_dict())
    assert len(lstm._input_quantizers) == len(lstm._weight_quantizers) == (4 if kwargs else 1)
    assert lstm._weight_quantizers[0].axis == 0  # per row of the fused gates
    x = torch.randn(3, 4, 5)
    quantizers = [m for m in lstm.modules() if isinstance(m, quant_nn.TensorQuantizer)]
    for q in quantizers:
        q.disable()
    expected, (h_ref, c_ref) = ref(x)
    out, (h, c) = lstm(x)
    for a, b in ((out, expected), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(a, b)
    for q in quantizers:
        q.enable()
    quantized, _ = lstm(x)
    assert 0 < (quantized - expected).abs().max() < 0.05
    quantized.sum().backward()
    assert lstm.weight_ih_l0.grad.abs().sum() > 0


def test_quant_lstm_cell_calibrates_input_and_hidden_together():
    torch.manual_seed(0)
    ref = nn.LSTMCell(5, 6)
    cell = quant_nn.QuantLSTMCell(5, 6, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    cell.load_state_dict(ref.state_dict())
    x, hx = torch.randn(4, 5), (torch.randn(4, 6) * 3, torch.randn(4, 6))
    cell.input_quantizer.disable_quant()
    cell.input_quantizer.enable_calib()
    cell(x, hx)
    cell.input_quantizer.enable_quant()
    cell.input_quantizer.disable_calib()
    cell.input_quantizer.load_calib_amax("percentile", percentile=100)
    assert float(cell.input_quantizer.amax) == pytest.approx(
        float(torch.cat([x, hx[0]], 1).abs().max()), rel=1e-3)  # the hidden state's range wins
    h, c = cell(x, hx)
    h_ref, c_ref = ref(x, hx)
    assert h.shape == (4, 6) and 0 < (h - h_ref).abs().max() < 0.05
    with pytest.raises(ValueError):
        quant_nn.QuantLSTM(5, 6, proj_size=2)

"""A pytorch-quantization program with only the package name changed: build under
initialize(), calibrate with the quantizer switches, one QAT step, reload the state into a
fresh model, export with the export context."""

import warnings

import onnx
import torch
import torch.nn.functional as F
from torch import nn

import trtqat as pytorch_quantization
from trtqat import calib, quant_modules
from trtqat import nn as quant_nn
from trtqat.tensor_quant import QuantDescriptor


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def _build():
    quant_nn.QuantConv2d.set_default_quant_desc_input(QuantDescriptor(calib_method="histogram"))
    try:
        quant_modules.initialize()
        model = LeNet()
    finally:
        quant_modules.deactivate()
        quant_nn.QuantConv2d.set_default_quant_desc_input(QuantDescriptor())
    return model


def _calibrate(model, data):
    for name, module in model.named_modules():
        if name.endswith("_quantizer"):
            module.disable_quant()
            module.enable_calib()
    for x in data:
        model(x)
    for name, module in model.named_modules():
        if name.endswith("_quantizer"):
            if isinstance(module._calibrator, calib.MaxCalibrator):
                module.load_calib_amax()
            else:
                module.load_calib_amax("percentile", percentile=99.99)
            module.enable_quant()
            module.disable_calib()


def test_pq_program_end_to_end(tmp_path):
    torch.manual_seed(0)
    model = _build()
    assert isinstance(model.conv1, quant_nn.QuantConv2d) and isinstance(model.fc, quant_nn.QuantLinear)
    assert isinstance(model.conv1.input_quantizer._calibrator, calib.HistogramCalibrator)
    data = [torch.rand(8, 1, 14, 14) for _ in range(3)]
    _calibrate(model.eval(), data)
    assert all(q.amax is not None for n, q in model.named_modules() if n.endswith("_quantizer"))

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = F.nll_loss(model(data[0]), torch.randint(10, (8,)))
    loss.backward()
    opt.step()
    assert model.conv1.weight.grad is not None and torch.isfinite(loss)

    fresh = _build()
    fresh.load_state_dict(model.state_dict())
    model.eval()
    fresh.eval()
    torch.testing.assert_close(fresh(data[1]), model(data[1]))

    path = tmp_path / "lenet.onnx"
    with pytorch_quantization.enable_onnx_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(fresh, (data[1],), str(path), dynamo=False, opset_version=17)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") == 6 and ops.count("DequantizeLinear") == 6

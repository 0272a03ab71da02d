"""Conv/Linear subclasses with a forward of their own (weight standardisation) are quantized
through the weight they compute, and exported with Q/DQ on that weight as a constant;
re-parameterizable blocks (RepVGG-style) are fused before quantizers are inserted."""

from __future__ import annotations

import copy
import logging
import pickle

import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

import trtqat
from trtqat.export.errors import ExportError
from trtqat.quant.modules import QuantConv2d
from trtqat.quant.own_forward import QuantOwnForward


class WSConv(nn.Conv2d):
    """A user's weight-standardised conv: its forward computes the weight it convolves."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         training=True, eps=1e-5).reshape_as(self.weight)
        return F.conv2d(x, w * 0.5, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class ScaledLinear(nn.Linear):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gain = nn.Parameter(torch.full((self.out_features, 1), 2.0))

    def forward(self, x):
        return F.linear(x, self.weight * self.gain, bias=self.bias)


def _effective(conv: WSConv) -> torch.Tensor:
    w = conv.weight.flatten(1)
    mean, var = w.mean(1, keepdim=True), w.var(1, unbiased=False, keepdim=True)
    return ((w - mean) / (var + 1e-5).sqrt()).reshape_as(conv.weight) * 0.5


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(WSConv(3, 32, 3, padding=1), nn.ReLU(), WSConv(32, 48, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         ScaledLinear(48, 4)).eval()


def _producer(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


def test_an_own_forward_subclass_is_quantized_through_its_effective_weight(tmp_path):
    model = _net()
    x = torch.randn(4, 3, 12, 12)
    trtqat.quantize(model, forward_loop=[x])
    conv, lin = model[0], model[6]
    assert isinstance(conv, QuantOwnForward) and isinstance(conv, WSConv)
    assert isinstance(lin, QuantOwnForward) and isinstance(lin, nn.Linear)
    # the weight quantizer saw the standardised weight, not the stored one (the second
    # conv has 13824 > 8192 weights: more than the ONNX exporter folds by itself)
    w_eff = _effective(conv).detach()
    assert torch.allclose(conv.weight_quantizer.amax.flatten(), w_eff.abs().amax((1, 2, 3)))
    assert not torch.allclose(conv.weight_quantizer.amax.flatten(),
                              conv.weight.detach().abs().amax((1, 2, 3)))
    with torch.no_grad():
        want = F.conv2d(conv.input_quantizer(x), conv.weight_quantizer(w_eff), conv.bias,
                        padding=1)
        assert torch.allclose(conv(x), want, atol=1e-6)
        # its own forward still runs: copies and pickles keep the class
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert type(twin[0]) is type(conv) and torch.allclose(twin(x), model(x))

    path = tmp_path / "ws.onnx"
    result = trtqat.export_onnx(model, x[:2], path, "int8", validation_data=[x])
    assert result.passed, result.lines()  # ONNX Runtime matches the PyTorch fake-quant model
    assert not [f for f in result.lint.findings if f.severity in ("warning", "error")]
    graph = onnx.load(path).graph
    inits = {t.name: t for t in graph.initializer}
    producer = _producer(graph)
    weighted = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert len(weighted) == 3
    for node in weighted:  # DQ of a constant: no float standardisation before the DQ
        dq = producer[node.input[1]]
        assert dq.op_type == "DequantizeLinear"
        source = producer.get(dq.input[0])
        assert dq.input[0] in inits or (source is not None and source.op_type == "QuantizeLinear"
                                        and source.input[0] in inits)
    assert not {"Sqrt", "Div", "Sub", "Pow", "BatchNormalization"} & {n.op_type
                                                                     for n in graph.node}
    first = producer[weighted[0].input[1]]
    codes = numpy_helper.to_array(inits[first.input[0]])
    scale = numpy_helper.to_array(inits[first.input[1]])
    dequant = torch.tensor(codes.astype("float32")) * torch.tensor(scale).view(-1, 1, 1,
                                                                                        1)
    assert torch.allclose(dequant, conv.weight_quantizer(w_eff), atol=1e-6)


class LoRALinear(nn.Linear):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.down, self.up = nn.Linear(self.in_features, 2), nn.Linear(2, self.out_features)

    def forward(self, x):  # the adapter's calls come first: they are not this layer's
        return self.up(self.down(x)) + F.linear(x, self.weight, self.bias)


def test_own_forward_off_and_float_module_list_keep_layers_float(caplog):
    caplog.set_level(logging.WARNING)
    model = _net()
    trtqat.quantize(model, {"own_forward": False, "graph": False})
    assert type(model[0]) is WSConv and type(model[6]) is ScaledLinear
    assert "forward of their own, so they stay float" in caplog.text
    caplog.clear()
    model = nn.Sequential(LoRALinear(4, 4))
    trtqat.quantize(model, {"graph": False})
    assert type(model[0]) is LoRALinear and "0 (LoRALinear)" in caplog.text
    model = nn.Sequential(_net(), nn.Conv2d(4, 4, 1))
    trtqat.quantize(model, {"float_module_list": ["Conv2d"], "graph": False})
    assert type(model[0][0]) is WSConv and type(model[1]) is nn.Conv2d
    assert isinstance(model[0][6], QuantOwnForward)


def test_timm_weight_standardised_convs_are_quantized(tmp_path):
    layers = pytest.importorskip("timm.layers")
    torch.manual_seed(0)
    model = nn.Sequential(layers.ScaledStdConv2d(3, 4, 3), layers.StdConv2dSame(4, 4, 3),
                          layers.ScaledStdConv2dSame(4, 4, 3, stride=2),
                          layers.Conv2dSame(4, 4, 3), nn.BatchNorm2d(4)).eval()
    model[4].running_var.fill_(4.0)
    x = torch.randn(2, 3, 9, 9)
    want = model(x)
    trtqat.quantize(model, forward_loop=[x])
    assert all(isinstance(m, QuantOwnForward) and m.weight_quantizer.amax is not None
               for m in model[:4])
    got = model(x)
    assert got.shape == want.shape and torch.allclose(got, want,
                                                      atol=0.15 * float(want.abs().max()))
    result = trtqat.export_onnx(model, x, tmp_path / "timm.onnx", "int8")
    assert result.passed and not result.notes, result.lines()  # the BatchNorm folded too
    ops = {n.op_type for n in onnx.load(tmp_path / "timm.onnx").graph.node}
    assert "BatchNormalization" not in ops and "Sqrt" not in ops


class RepBlock(nn.Module):
    """A RepVGG-style block: 3x3 conv+BN, 1x1 conv+BN and an identity BN, fused by
    ``reparameterize()`` into one 3x3 conv (as timm's RepVggBlock)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv3 = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.conv1 = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.identity = nn.BatchNorm2d(c)
        self.reparam = None

    def forward(self, x):
        if self.reparam is not None:
            return F.relu(self.reparam(x))
        return F.relu(self.conv3(x) + self.conv1(x) + self.identity(x))

    @staticmethod
    def _fold(w: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
        std = (bn.running_var + bn.eps).sqrt()
        return w * (bn.weight / std).view(-1, 1, 1, 1), bn.bias - bn.running_mean * bn.weight / std

    @torch.no_grad()
    def reparameterize(self) -> None:
        if self.reparam is not None:
            return
        c = self.identity.num_features
        eye = torch.zeros(c, c, 3, 3)
        eye[range(c), range(c), 1, 1] = 1
        parts = [self._fold(self.conv3[0].weight, self.conv3[1]),
                 self._fold(F.pad(self.conv1[0].weight, (1, 1, 1, 1)), self.conv1[1]),
                 self._fold(eye, self.identity)]
        self.reparam = nn.Conv2d(c, c, 3, padding=1)
        self.reparam.weight.copy_(sum(w for w, _ in parts))
        self.reparam.bias.copy_(sum(b for _, b in parts))
        del self.conv3, self.conv1, self.identity


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))

    def reparameterize(self, mu, logvar):  # not a re-parameterization hook
        raise AssertionError("called")


def _rep_net() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), RepBlock(4), RepBlock(4), VAE(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    for m in model.modules():  # non-trivial statistics, so the fused conv differs
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return model.eval()


def test_reparameterizable_blocks_are_fused_before_quantizing(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    model = _rep_net()
    x = torch.randn(4, 3, 10, 10)
    with torch.no_grad():
        want = model(x)
    trtqat.quantize(model, forward_loop=[x])
    assert "NOTE re-parameterized 2 module(s) in place before quantizing (2 RepBlock)" \
        in caplog.text
    assert all(isinstance(b.reparam, QuantConv2d) and not hasattr(b, "identity")
               for b in model[1:3])
    from trtqat.quant.model_ops import disable_quantization, enable_quantization

    disable_quantization(model)
    with torch.no_grad():  # the fused model computes what the training form computed
        assert torch.allclose(model(x), want, atol=1e-5)
    enable_quantization(model)
    path = tmp_path / "rep.onnx"
    result = trtqat.export_onnx(model, x[:2], path, "int8")
    assert result.passed, result.lines()
    assert not [f for f in result.lint.findings if f.severity in ("warning", "error")]
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert "BatchNormalization" not in ops and "Add" not in ops


def test_int8_export_refuses_the_training_form(tmp_path):
    model = _rep_net()
    x = torch.randn(2, 3, 10, 10)
    trtqat.quantize(model, {"reparameterize": False}, forward_loop=[x])
    assert model[1].reparam is None
    with pytest.raises(ExportError) as err:
        trtqat.export_onnx(model, x, tmp_path / "rep.onnx", "int8")
    message = str(err.value)
    assert "\n" not in message and "timm.utils.reparameterize_model" in message
    assert message.startswith("2 module(s)") and "(e.g. 1 (RepBlock))" in message
    assert not list(tmp_path.iterdir())


def test_graph_1_checkpoints_keep_the_earlier_rules():
    from trtqat.families.cnn.models import quantize_classifier

    model = nn.Sequential(_rep_net(), _net())
    quantize_classifier(model, placement="graph-1")  # as a graph-1 checkpoint is rebuilt
    assert model[0][1].reparam is None and type(model[1][0]) is WSConv
    assert isinstance(model[0][1].conv3[0], QuantConv2d)


def test_checkpoints_reparameterize_with_their_own_statistics():
    from trtqat import families
    from trtqat.families.cnn.family import restore
    from trtqat.quant.model_ops import disable_quantization
    from trtqat.quant.placement import PLACEMENT_VERSION

    cnn = families.get("cnn")
    trained, x = _rep_net(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        want = trained(x)
    spec = {"arch": "rep", "num_classes": 3}
    fresh = nn.Sequential(*[copy.deepcopy(m) for m in trained])
    for m in fresh.modules():  # a freshly built model: default BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
    # PTQ from an FP32 checkpoint: its weights first, then fused with its statistics
    model = restore(cnn, copy.deepcopy(fresh), {"model": spec, "state_dict":
                                                trained.state_dict()}, quantized=True)
    assert isinstance(model[1].reparam, QuantConv2d)
    disable_quantization(model)
    with torch.no_grad():
        assert torch.allclose(model(x), want, atol=1e-5)
    # the quantized checkpoint loads back quantized, and as float (re-parameterized)
    ckpt = {"model": {**spec, "quantized": True, "placement": PLACEMENT_VERSION},
            "state_dict": model.state_dict()}
    for quantized in (True, False):
        again = restore(cnn, copy.deepcopy(fresh), ckpt, quantized=quantized).eval()
        disable_quantization(again)
        with torch.no_grad():
            assert torch.allclose(again(x), want, atol=1e-5)


class HalfConv1d(nn.Conv1d):
    def forward(self, x):
        return F.conv1d(x, self.weight * 0.5, self.bias, self.stride, self.padding)


class HalfConvT2d(nn.ConvTranspose2d):
    def forward(self, x):
        return F.conv_transpose2d(x, self.weight * 0.5, self.bias, self.stride)


@pytest.mark.parametrize("layer, x", [
    (HalfConv1d(3, 5, 3), torch.randn(2, 3, 8)),
    (HalfConvT2d(3, 5, 2, stride=2), torch.randn(2, 3, 4, 4)),
    (ScaledLinear(3, 5), torch.randn(2, 3))])
def test_every_weighted_layer_kind_gets_its_own_weight_axis(layer, x):
    want_amax = (layer.weight.detach() * (0.5 if not isinstance(layer, ScaledLinear) else 2.0))
    q = QuantOwnForward.from_float(layer)  # the generic entry: the layer's own kind decides
    assert q is layer and isinstance(q, QuantOwnForward)
    q.weight_quantizer.enable_calib()
    q.weight_quantizer.disable_quant()
    q.input_quantizer.disable()
    q(x)
    q.weight_quantizer.load_calib_amax()
    axis = 1 if isinstance(layer, nn.ConvTranspose2d) else 0
    dims = tuple(d for d in range(want_amax.dim()) if d != axis)
    assert torch.allclose(q.weight_quantizer.amax.flatten(), want_amax.abs().amax(dims))

"""INT4 block-wise weights (format int4): weight-only placement, block amax (max, mse), QAT
of the block amax, and the one-line errors of bad input."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from train_steps import fit

import trtqat
from trtqat.errors import TrtqatError
from trtqat.export.prepare import skipped_layers
from trtqat.quant.block_amax import block_amax
from trtqat.quant.blockwise import BlockQuantizer, int4_weight_quantizer, is_block
from trtqat.quant.model_ops import quantizers


class ConvMLP(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 4 * 4, width)
        self.fc2 = nn.Linear(width, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(y)) + 1.0)


def _int4(model: nn.Module, x: torch.Tensor, **cfg) -> nn.Module:
    return trtqat.quantize(model, {"format": "int4", "block_size": 32, **cfg},
                           forward_loop=[x])


def test_int4_quantizes_linear_weights_only(caplog):
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4, 4)
    with caplog.at_level(logging.WARNING):
        model = _int4(ConvMLP(), x, method="max")
    assert "conv" in caplog.text and "keep float weights" in caplog.text
    active = {n for n, q in quantizers(model) if not q.disabled}
    assert active == {"fc1._weight_quantizer", "fc2._weight_quantizer"}
    assert all(is_block(q) for n, q in quantizers(model) if n in active)
    assert all(q._format_off for n, q in quantizers(model) if n not in active)
    assert skipped_layers(model) == ()  # switched off by the format, not float on purpose
    model.fc1._input_quantizer.enable()  # e.g. a sensitivity sweep: stays off
    assert model.fc1._input_quantizer.disabled
    q, w = model.fc1._weight_quantizer, model.fc1.weight.detach()
    assert tuple(q.amax.shape) == (64, 2)
    assert torch.equal(q.amax, w.abs().reshape(64, 2, 32).amax(-1))
    scale = (q.amax / 7).repeat_interleave(32, dim=1)
    codes = torch.round(w / scale)
    assert codes.abs().max() <= 7
    assert torch.equal(q(w), codes * scale)  # code x scale, as DequantizeLinear computes
    with torch.no_grad():  # activations float: only the weights changed
        want = model.fc2(torch.relu(nn.functional.linear(
            torch.relu(model.conv(x)).flatten(1), codes * scale, model.fc1.bias)) + 1.0)
        assert torch.allclose(model(x), want, atol=1e-6)


def test_mse_block_amax_clips_outliers_and_never_loses_to_max():
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    w[0, 5] = 20.0  # one outlier in block (0, 0)
    peak, mse = block_amax(w, 32, "max"), block_amax(w, 32, "mse")
    assert bool((mse <= peak).all()) and float(mse[0, 0]) < float(peak[0, 0])

    def err(amax):
        s = (amax / 7).repeat_interleave(32, dim=1)
        return ((torch.round(w / s).clamp(-7, 7) * s - w) ** 2).reshape(16, 2, 32).sum(-1)

    assert bool((err(mse) <= err(peak) + 1e-7).all())
    assert float(err(mse).sum()) < float(err(peak).sum())


def test_qat_learns_the_block_amax_and_lowers_the_loss():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(64, 64)
    import copy

    student = _int4(copy.deepcopy(teacher), x, method="max")
    q = student[0]._weight_quantizer
    q.init_learn_amax()
    assert isinstance(q._amax, nn.Parameter)
    start = q.amax.clone()
    ranges = [p for n, p in student.named_parameters() if n.endswith("_amax")]
    opt = torch.optim.Adam(ranges, lr=1e-2)
    with torch.no_grad():
        target = teacher(x)
    losses = fit(lambda: nn.functional.mse_loss(student(x), target), opt, 15)
    assert not torch.equal(q.amax, start)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("case, match", [
    ("block", r"fc1: block_size 64 does not divide its in_features 96: use block_size 32, "
              r"or leave the layer float \(skip_layers\)"),
    ("conv-only", r"format int4 quantizes Linear/MatMul weights only.*use format int8"),
    ("conv-asked", r"INT4 block-wise weights are for Linear/MatMul layers, not a QuantConv2d"),
    ("conv-weight", r"not a weight of shape \(4, 3, 3, 3\) \(a conv\)"),
    ("method", r"histogram method for activations; format int4 \(weights only\) takes max "
               r"or mse"),
    ("size", r"block_size must be one of 32, 64, 128, got 16"),
    ("nan", r"fc1._weight_quantizer': amax contains NaN or inf"),
])
def test_bad_int4_input_is_one_line(case, match):
    torch.manual_seed(0)
    with pytest.raises(TrtqatError, match=match) as info:
        if case == "block":
            model = nn.Sequential()
            model.add_module("fc1", nn.Linear(96, 8))
            trtqat.quantize(model, {"format": "int4", "block_size": 64})
        elif case == "conv-only":
            trtqat.quantize(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), {"format": "int4"})
        elif case == "conv-asked":
            model = trtqat.quantize(ConvMLP(), {"format": "int8"})
            int4_weight_quantizer(model.conv, "_weight_quantizer", 32, "conv")
        elif case == "conv-weight":
            BlockQuantizer(32)(torch.randn(4, 3, 3, 3))
        elif case == "method":
            trtqat.quantize(ConvMLP(), {"format": "int4", "method": "percentile"})
        elif case == "nan":
            model = ConvMLP()
            with torch.no_grad():
                model.fc1.weight[3, 7] = float("nan")
            _int4(model, torch.randn(2, 3, 4, 4))
        else:
            trtqat.quantize(ConvMLP(), {"format": "int4", "block_size": 16})
    assert "\n" not in str(info.value)


def test_awq_scaling_lowers_the_int4_error_and_keeps_the_float_model():
    import copy

    from trtqat.quant.awq import apply_awq
    from trtqat.quant.blockwise import to_int4_weights
    from trtqat.quant.config import QuantConfig
    from trtqat.quant.model_ops import disable_quantization
    from trtqat.quant.placement import place

    torch.manual_seed(0)
    float_model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    x = torch.randn(256, 128)
    x[:, :8] *= 20  # a few input channels carry most of the signal

    def int4(awq: bool) -> nn.Module:
        model = copy.deepcopy(float_model)
        place(model, QuantConfig())
        to_int4_weights(model, 32)
        if awq:
            alphas = apply_awq(model, lambda m, b: m(b), [x])
            assert set(alphas) == {"0", "2"} and max(alphas.values()) > 0
        trtqat.calibrate(model, [x], "max")
        return model

    with torch.no_grad():
        want = float_model(x)
        plain, scaled = int4(False), int4(True)
        assert float((scaled(x) - want).square().mean()) < \
            0.9 * float((plain(x) - want).square().mean())
        assert scaled[0]._input_quantizer.pre_quant_scale is not None
        disable_quantization(scaled)  # the scaling alone is the float layer again
        assert torch.allclose(scaled(x), want, atol=1e-5)

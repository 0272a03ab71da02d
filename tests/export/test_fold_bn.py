"""BatchNorm folding: exact for per-channel weight quantization."""

from __future__ import annotations

import logging

import pytest
import torch
from export_testlib import MAX_CALIB, batches, make_tiny
from torch import nn

from trtqat.export import fold_batchnorm
from trtqat.export.fold_bn import find_conv_bn_pairs
from trtqat.quant.modules import QuantConv2d, QuantConvTranspose2d


def _conv_bn(conv: nn.Module, channels: int) -> nn.Sequential:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.3, 3.0)
        bn.weight.uniform_(-1.5, 1.5)  # negative gammas flip the sign of a channel's codes
        bn.bias.uniform_(-0.3, 0.3)
    model = nn.Sequential(conv, bn).eval()
    return model


def _calibrated(model: nn.Module, x: torch.Tensor) -> nn.Module:
    from trtqat.quant import collect_stats, compute_amax

    collect_stats(model, [x], progress=False)
    compute_amax(model, "max")
    return model


def _codes(conv) -> torch.Tensor:
    q = conv._weight_quantizer
    step = q.amax / q.maxbound
    return torch.round(conv.weight / step).clamp(-127, 127)


@pytest.mark.parametrize("transpose", [False, True])
def test_fold_is_exact_for_per_channel_weights(transpose):
    if transpose:
        conv = QuantConvTranspose2d(6, 5, 3, padding=1, quant_desc_input=MAX_CALIB)
    else:
        conv = QuantConv2d(6, 5, 3, padding=1, quant_desc_input=MAX_CALIB)
    model = _conv_bn(conv, 5)
    x = torch.randn(4, 6, 9, 9)
    _calibrated(model, x)
    folded = fold_batchnorm(model)
    assert isinstance(folded[1], nn.Identity) and isinstance(model[1], nn.BatchNorm2d)
    with torch.no_grad():
        ref, got = model(x), folded(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    gamma = model[1].weight.detach()
    sign = torch.sign(gamma).reshape([1, -1, 1, 1] if transpose else [-1, 1, 1, 1])
    assert torch.equal(_codes(folded[0]), _codes(model[0]) * sign)


def test_fold_finds_every_pair_of_resnet18_and_keeps_outputs():
    from trtqat.families.cnn.models import build_model

    model = build_model("resnet18", 10, quantized=True, quant_desc_input=MAX_CALIB).eval()
    assert len(find_conv_bn_pairs(model)) == 20
    folded = fold_batchnorm(model)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # original untouched


def test_folded_tiny_model_agrees_with_unfolded():
    model = make_tiny()
    folded = fold_batchnorm(model)
    x = batches(1, seed=5)[0]
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-4, atol=1e-4)


def test_per_tensor_weight_quantizer_is_recalibrated(caplog):
    conv = QuantConv2d(3, 4, 3, quant_desc_input=MAX_CALIB, quant_desc_weight=MAX_CALIB)
    model = _calibrated(_conv_bn(conv, 4), torch.randn(2, 3, 8, 8))
    with caplog.at_level(logging.WARNING):
        folded = fold_batchnorm(model)
    q = folded[0]._weight_quantizer
    assert torch.allclose(q.amax, folded[0].weight.abs().max())
    assert "per-tensor weight quantizer" in caplog.text


def test_untraceable_model_falls_back_to_sequential_pairs():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace this
                return self.body(x)
            return self.body(-x)

    model = Branchy().eval()
    assert find_conv_bn_pairs(model) == [("body.0", "body.1")]

"""Quant layers, calibrate_weights, optim.helper and QuantModuleReplacementHelper as in
pytorch-quantization."""

import pytest
import torch
from torch import nn

from trtqat import nn as quant_nn
from trtqat import quant_modules
from trtqat.calib import calibrate_weights
from trtqat.errors import TrtqatError
from trtqat.nn.modules._utils import pop_quant_desc_in_kwargs
from trtqat.optim import helper
from trtqat.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor


@pytest.mark.parametrize("cls,shape", [(quant_nn.QuantInstanceNorm1d, (2, 3, 8)),
                                       (quant_nn.QuantInstanceNorm2d, (2, 3, 4, 4)),
                                       (quant_nn.QuantInstanceNorm3d, (2, 3, 2, 2, 2))])
def test_instance_norm_quantizes_its_input(cls, shape):
    layer = cls(3, affine=True)
    x = torch.randn(*shape)
    layer.input_quantizer.disable()
    ref = getattr(nn, cls.__name__[5:])(3, affine=True)
    ref.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x), ref(x))
    layer.input_quantizer.enable()
    layer.input_quantizer.amax = 0.5
    assert not torch.allclose(layer(x), ref(x))


def test_fake_quant_false_and_unused_keys_are_refused():
    real = QuantDescriptor(fake_quant=False)
    with pytest.raises(ValueError, match="fake"):
        quant_nn.QuantLinear(3, 4, quant_desc_weight=real)
    with pytest.raises(ValueError, match="fake"):
        quant_nn.QuantMaxPool2d(2, quant_desc_input=real)
    with pytest.raises(TypeError, match="Unused keys") as info:
        quant_nn.QuantConv2d(3, 4, 3, quant_desc_bias=QUANT_DESC_8BIT_PER_TENSOR)
    assert isinstance(info.value, TrtqatError)
    with pytest.raises(TypeError, match="Unused keys"):
        pop_quant_desc_in_kwargs(quant_nn.QuantLinear, input_only=True, quant_desc_weight=None)
    with pytest.raises(ValueError):
        quant_nn.QuantConv2d.set_default_quant_desc_input("not a descriptor")


def test_pop_quant_desc_in_kwargs_defaults():
    desc = QuantDescriptor(num_bits=4)
    assert pop_quant_desc_in_kwargs(quant_nn.QuantLinear, quant_desc_input=desc) == (
        desc, quant_nn.QuantLinear.default_quant_desc_weight)
    assert pop_quant_desc_in_kwargs(quant_nn.QuantMaxPool2d, input_only=True) == QUANT_DESC_8BIT_PER_TENSOR


@pytest.mark.parametrize("method", ["max", "percentile", "mse"])
def test_calibrate_weights(method):
    model = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), quant_nn.QuantConvTranspose2d(4, 2, 3))
    calibrate_weights(model, method=method, perchannel=True)
    conv_amax, convt_amax = model[0].weight_quantizer.amax, model[1].weight_quantizer.amax
    assert conv_amax.shape == (4, 1, 1, 1) and convt_amax.shape == (1, 2, 1, 1)
    wmax = model[0].weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)
    assert bool((conv_amax <= wmax + 1e-6).all()) and bool((conv_amax > 0).all())
    if method == "max":
        torch.testing.assert_close(conv_amax, wmax)
    calibrate_weights(model, method="max", perchannel=False)
    assert model[0].weight_quantizer.amax.shape == ()
    with pytest.raises(TypeError):
        calibrate_weights(model, method="entropy")


def test_optim_helper():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    assert len(list(helper.match_parameters(model, ["0.weight", "bias"]))) == 3
    groups = helper.group_parameters(model, [["^0\\."], ["^1\\."]], lrs=[0.1, 0.01])
    assert [g["lr"] for g in groups] == [0.1, 0.01]
    assert len(list(groups[0]["params"])) == 2
    with pytest.raises(TypeError, match="must be list of list of patterns"):
        helper.group_parameters(None, [["^0"], "^1"])
    with pytest.raises(TypeError, match="must match"):
        helper.group_parameters(None, [["^0"], ["^1"]], momentums=[0.9])
    helper.freeze_parameters(model, ["^1\\."])
    assert [p.requires_grad for p in model.parameters()] == [True, True, False, False]


def test_quant_weight_inplace():
    layer = quant_nn.QuantLinear(8, 4)
    layer.weight_quantizer.amax = torch.full((4, 1), 0.5)
    helper.quant_weight_inplace(nn.Sequential(layer))
    codes = layer.weight.detach() / (0.5 / 127)
    torch.testing.assert_close(codes, codes.round(), atol=1e-4, rtol=0)


def test_replacement_helper_swaps_and_restores():
    original = nn.Linear
    h = quant_modules.QuantModuleReplacementHelper()
    h.prepare_state(float_module_list=["Conv2d"])
    assert all(e.mod_name != "Conv2d" for e in h.quant_map)
    h.apply_quant_modules()
    try:
        assert nn.Linear is quant_nn.QuantLinear and nn.Conv2d is not quant_nn.QuantConv2d
    finally:
        h.restore_float_modules()
    assert nn.Linear is original


def test_documented_calibrator_results_and_errors():
    from trtqat.calib import HistogramCalibrator, MaxCalibrator

    c = HistogramCalibrator(8, None, False, skip_zeros=True, grow_method="append")  # ignored
    c.collect(torch.tensor([0, 0, 0, 0, 0, 1, 2, 3, 4, 5]))
    c.collect(torch.tensor([0, 0, 0, 0, 0, 6, 7, 8, 9, 10]))
    assert abs(c.compute_amax("percentile", percentile=50).item() - 5.0) < 10 / 2048
    p = HistogramCalibrator(8, None, False)
    p.collect(torch.arange(100))
    assert abs(p.compute_amax("percentile", percentile=90).item() - 89.0) < 100 / 1024
    for bad in (-10, 200):
        with pytest.raises(ValueError, match="range"):
            p.compute_amax("percentile", percentile=bad)
    with pytest.raises(TypeError):
        p.compute_amax("magic")
    m = HistogramCalibrator(8, None, False)
    x = torch.ones(11, 7, 3, 3) * 255.0
    x[1, 1, 1, 1] = 256.0
    m.collect(x)
    amax = m.compute_amax("mse")
    assert (amax - 255.0).abs() < (amax - 256.0).abs()
    mc = MaxCalibrator(8, 0, False)
    mc.collect(torch.rand(32, 3))
    with pytest.raises(RuntimeError, match="shape changed"):
        mc.collect(torch.rand(33, 3))

"""quant_modules.initialize/deactivate, quantize(), model-wide calibration helpers."""

import pytest
import torch
import torchvision
from torch import nn

import trtqat
from trtqat import nn as quant_nn
from trtqat import quant_modules
from trtqat.errors import CalibrationError, QuantConfigError
from trtqat.quant.modules import FLOAT_TO_QUANT

ORIGINALS = {name: getattr(nn, name) for name in (
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Linear", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d", "MaxPool2d")}


def test_initialize_replaces_and_deactivate_restores():
    quant_modules.initialize()
    try:
        assert nn.Conv2d is quant_nn.QuantConv2d and nn.Linear is quant_nn.QuantLinear
        assert nn.ConvTranspose3d is quant_nn.QuantConvTranspose3d
        assert nn.AdaptiveAvgPool2d is quant_nn.QuantAdaptiveAvgPool2d
        assert nn.MaxPool2d is ORIGINALS["MaxPool2d"]  # not swapped, like the original
        model = torchvision.models.resnet18(num_classes=10)
    finally:
        quant_modules.deactivate()
    for name, cls in ORIGINALS.items():
        assert getattr(nn, name) is cls, name
    assert isinstance(model.conv1, quant_nn.QuantConv2d)
    assert isinstance(model.fc, quant_nn.QuantLinear)
    assert isinstance(model.conv1.weight_quantizer, quant_nn.TensorQuantizer)
    assert model.conv1.weight_quantizer.axis == 0  # stored as given: axis=(0) is the int 0


def test_context_manager_float_module_list_and_custom():
    class MyLinear(quant_nn.QuantLinear):
        pass

    with quant_modules.initialized(float_module_list=["Conv2d"],
                                   custom_quant_modules=[(nn, "Linear", MyLinear)]):
        assert nn.Conv2d is ORIGINALS["Conv2d"]
        assert nn.Linear is MyLinear
    assert nn.Linear is ORIGINALS["Linear"]
    with pytest.raises(QuantConfigError, match="Conv9d"):
        quant_modules.initialize(float_module_list=["Conv9d"])
    assert not quant_modules.is_active()


def test_set_default_quant_desc():
    desc = trtqat.QuantDescriptor(num_bits=8, calib_method="histogram")
    old = quant_nn.QuantConv2d.default_quant_desc_input
    quant_nn.QuantConv2d.set_default_quant_desc_input(desc)
    try:
        conv = quant_nn.QuantConv2d(3, 3, 1)
        assert type(conv.input_quantizer._calibrator).__name__ == "HistogramCalibrator"
    finally:
        quant_nn.QuantConv2d.set_default_quant_desc_input(old)


@pytest.mark.parametrize("cls,shape,axis", [
    (quant_nn.QuantConv1d, (2, 3, 9), 0),
    (quant_nn.QuantConv3d, (2, 3, 5, 5, 5), 0),
    (quant_nn.QuantConvTranspose2d, (2, 3, 6, 6), (1,)),
    (quant_nn.QuantLinear, (2, 3), 0),
])
def test_layers_match_float_when_quantizers_disabled(cls, shape, axis):
    layer = cls(3, 4, 3) if cls is not quant_nn.QuantLinear else cls(3, 4)
    assert layer.weight_quantizer.axis == axis
    x = torch.randn(*shape)
    layer.input_quantizer.disable()
    layer.weight_quantizer.disable()
    float_cls = {q: f for f, q in FLOAT_TO_QUANT.items()}[cls]
    ref = float_cls.forward(layer, x)
    torch.testing.assert_close(layer(x), ref)


def test_quantize_built_model_shares_parameters_and_calibrates():
    model = torchvision.models.resnet18(num_classes=10)
    w = model.conv1.weight
    trtqat.quantize(model)
    assert isinstance(model.conv1, quant_nn.QuantConv2d) and model.conv1.weight is w
    assert model.conv1.weight_quantizer._name == "conv1._weight_quantizer"
    data = [(torch.randn(2, 3, 32, 32), 0) for _ in range(3)]
    assert trtqat.collect_stats(model, data, num_batches=2, progress=False) == 2
    trtqat.compute_amax(model, "max")
    assert float(model.conv1.input_quantizer.amax) > 0
    out = model(data[0][0])
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_quantize_skip_layers_and_errors():
    model = torchvision.models.resnet18(num_classes=10)
    trtqat.quantize(model, trtqat.QuantConfig(skip_layers=("fc", "layer4.*")))
    assert type(model.fc) is nn.Linear
    assert type(model.layer4[0].conv1) is ORIGINALS["Conv2d"]
    with pytest.raises(CalibrationError, match="no data"):
        trtqat.collect_stats(model, [], progress=False)
    with pytest.raises(CalibrationError, match="unknown calibration method"):
        trtqat.compute_amax(model, "median")
    with pytest.raises(CalibrationError, match="no TensorQuantizer"):
        trtqat.collect_stats(nn.Sequential(nn.ReLU()), [torch.ones(1)], progress=False)


def test_quantize_says_when_a_model_has_nothing_it_can_quantize():
    """A model without a layer trtqat quantizes (transformers' GPT-2 uses its own Conv1D) is
    one QuantConfigError from quantize() naming the model, not a calibration error that
    tells the user to call quantize()."""
    from trtqat.errors import QuantConfigError

    with pytest.raises(QuantConfigError, match="no layer to quantize in Sequential: it "
                                               "quantizes Conv"):
        trtqat.quantize(nn.Sequential(nn.ReLU(), nn.Flatten()), forward_loop=[torch.ones(1, 2)])
    with pytest.raises(QuantConfigError, match=r"skip_layers \['\*'\] match every layer"):
        trtqat.quantize(nn.Sequential(nn.Linear(2, 2)), trtqat.QuantConfig(skip_layers=("*",)))
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2,
                                                          vocab_size=16, n_positions=8))
    with pytest.raises(QuantConfigError, match="GPT2Model: decoder Hugging Face models"):
        trtqat.quantize(gpt2, forward_loop=[{"input_ids": torch.ones(1, 4, dtype=torch.long)}])


def test_attention_note_only_for_models_that_have_attention(caplog):
    """A Hugging Face model without attention (ConvNeXt) was told its attention was left in
    float; a model whose attention trtqat cannot wire (GPT-2's) still is."""
    import logging

    from trtqat.errors import QuantConfigError

    transformers = pytest.importorskip("transformers")
    convnext = transformers.ConvNextModel(transformers.ConvNextConfig(
        num_stages=1, hidden_sizes=[8], depths=[1])).eval()
    with caplog.at_level(logging.WARNING):
        trtqat.quantize(convnext)
    assert not [r for r in caplog.records if "attention left in float" in r.getMessage()]
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2,
                                                          vocab_size=16, n_positions=8))
    with caplog.at_level(logging.WARNING), pytest.raises(QuantConfigError, match="decoder"):
        trtqat.quantize(gpt2)
    assert [r for r in caplog.records if "attention left in float" in r.getMessage()]


def test_an_all_zero_weight_is_named_as_such_not_as_missing_data():
    """torchvision's ViT head starts at zero: its weight quantizer's amax is 0 whatever the
    calibration data, so the error says so instead of asking for data reaching the layer."""
    from trtqat.errors import AmaxValueError

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))
    nn.init.zeros_(model[2].weight)
    with pytest.raises(AmaxValueError, match=r"'2\._weight_quantizer': amax is 0, so nothing "
                                             r"can be represented: the layer's weights are all "
                                             r"zero .* or keep the layer in float"):
        trtqat.quantize(model, forward_loop=[torch.randn(2, 4)])

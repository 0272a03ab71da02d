"""pytorch-quantization module paths: every public name imports from the same place."""

import importlib

import pytest

NAMES = {
    "trtqat.nn": ["TensorQuantizer", "QuantConv1d", "QuantConv2d", "QuantConv3d",
                  "QuantConvTranspose1d", "QuantConvTranspose2d", "QuantConvTranspose3d",
                  "QuantLinear", "QuantAvgPool2d", "QuantMaxPool2d", "QuantAdaptiveAvgPool2d",
                  "QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d", "Clip",
                  "Conv2d", "Linear", "functional", "QuantLSTM", "QuantLSTMCell"],
    "trtqat.nn.modules.tensor_quantizer": ["TensorQuantizer"],
    "trtqat.nn.modules.quant_conv": ["QuantConv1d", "QuantConv2d", "QuantConv3d",
                                     "QuantConvTranspose1d", "QuantConvTranspose2d",
                                     "QuantConvTranspose3d", "Conv2d", "ConvTranspose2d"],
    "trtqat.nn.modules.quant_linear": ["QuantLinear", "Linear"],
    "trtqat.nn.modules.quant_pooling": ["QuantMaxPool1d", "QuantMaxPool2d", "QuantMaxPool3d",
                                        "QuantAvgPool1d", "QuantAvgPool2d", "QuantAvgPool3d",
                                        "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d",
                                        "QuantAdaptiveAvgPool3d", "MaxPool2d", "AvgPool2d"],
    "trtqat.nn.modules.quant_instancenorm": ["QuantInstanceNorm1d", "QuantInstanceNorm2d",
                                             "QuantInstanceNorm3d"],
    "trtqat.nn.modules.clip": ["Clip"],
    "trtqat.nn.modules.quant_rnn": ["QuantLSTM", "QuantLSTMCell", "LSTM", "LSTMCell"],
    "trtqat.nn.modules._utils": ["QuantMixin", "QuantInputMixin", "pop_quant_desc_in_kwargs"],
    "trtqat.nn.functional": ["clip", "ClipFunction"],
    "trtqat.utils": ["reduce_amax"],
    "trtqat.utils.reduce_amax": ["reduce_amax"],
    "trtqat.utils.quant_logging": ["reset_logger_handler"],
    "trtqat.utils.amp_wrapper": ["half_function", "float_function", "promote_function"],
    "trtqat.optim.helper": ["match_parameters", "group_parameters", "freeze_parameters",
                            "quant_weight_inplace"],
    "trtqat.quant_modules": ["initialize", "deactivate", "enable_onnx_export",
                             "QuantModuleReplacementHelper"],
    "trtqat.calib": ["MaxCalibrator", "HistogramCalibrator", "calibrate_weights"],
    "trtqat.calib.max": ["MaxCalibrator"],
    "trtqat.calib.histogram": ["HistogramCalibrator", "calibrate_weights"],
    "trtqat.calib.calibrator": ["_Calibrator"],
    "trtqat.version": ["__version__"],
    "trtqat": ["initialize", "deactivate", "QuantModuleReplacementHelper", "__version__"],
    "trtqat.tensor_quant": ["QuantDescriptor", "ScaledQuantDescriptor", "tensor_quant",
                            "fake_tensor_quant", "legacy_fake_tensor_quant",
                            "fake_affine_tensor_quant", "scaled_e4m3", "TensorQuantFunction",
                            "FakeTensorQuantFunction",
                            "QUANT_DESC_8BIT_PER_TENSOR", "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
                            "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
                            "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
                            "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
                            "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
                            "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
                            "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
                            "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL"],
}


@pytest.mark.parametrize("module,name", [(m, n) for m, names in NAMES.items() for n in names])
def test_public_name_imports(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def test_paths_name_the_same_objects():
    from trtqat import nn as quant_nn
    from trtqat.nn.modules import _utils, quant_conv, quant_instancenorm, tensor_quantizer

    assert tensor_quantizer.TensorQuantizer is quant_nn.TensorQuantizer
    assert quant_conv.Conv2d is quant_conv.QuantConv2d is quant_nn.QuantConv2d
    assert issubclass(quant_nn.QuantConv2d, _utils.QuantMixin)
    assert issubclass(quant_instancenorm.QuantInstanceNorm2d, _utils.QuantInputMixin)


def test_cuda_extension_is_not_provided():
    # pytorch_quantization.cuda_ext is its compiled CUDA kernel; trtqat has no such module
    with pytest.raises(ImportError):
        importlib.import_module("trtqat.cuda_ext")


def test_utils_helpers():
    import logging

    from trtqat.utils import amp_wrapper, quant_logging

    root = logging.getLogger()
    saved = list(root.handlers)
    root.addHandler(logging.NullHandler())
    try:
        quant_logging.reset_logger_handler()
        assert root.handlers == []
    finally:
        for h in saved:
            root.addHandler(h)
    assert amp_wrapper.half_function(len) is len and amp_wrapper.promote_function(abs) is abs


def test_calib_submodules_and_top_level_name_the_same_objects():
    import trtqat
    from trtqat import calib, quant_modules
    from trtqat.calib import calibrator, histogram
    from trtqat.calib import max as calib_max

    assert calib_max.MaxCalibrator is calib.MaxCalibrator
    assert histogram.HistogramCalibrator is calib.HistogramCalibrator
    assert histogram.calibrate_weights is calib.calibrate_weights
    assert issubclass(calib.MaxCalibrator, calibrator._Calibrator)
    assert trtqat.initialize is quant_modules.initialize
    assert trtqat.deactivate is quant_modules.deactivate

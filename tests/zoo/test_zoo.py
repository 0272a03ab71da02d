"""The classification zoo through PTQ in CI: calibrate (max), INT8 export with every check,
a clean lint and an ORT engine that runs, for one small member of each torchvision family.

Each family is built from torchvision's own classes with few blocks and narrow widths, at
16-32 px, so the whole sweep stays small; ``benchmarks/zoo.py`` runs the usual sizes.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.models as tvm
from torch import nn

pytestmark = pytest.mark.zoo


def _vgg() -> nn.Module:
    from torchvision.models.vgg import VGG, make_layers

    model = VGG(make_layers([8, "M", 16, "M", 16, "M"], batch_norm=True), num_classes=10)
    model.classifier = nn.Sequential(nn.Linear(16 * 7 * 7, 10))
    return model


def _convnext() -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)


def _efficientnet() -> nn.Module:
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    settings = [MBConvConfig(1, 3, 1, 16, 8, 1), MBConvConfig(6, 3, 2, 8, 16, 2)]
    return EfficientNet(settings, dropout=0.0, num_classes=10, last_channel=32)


def _mobilenet_v3() -> nn.Module:
    from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3

    settings = [InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 1.0),
                InvertedResidualConfig(16, 3, 32, 16, True, "HS", 1, 1, 1.0)]
    return MobileNetV3(settings, last_channel=64, num_classes=10)


# family -> (name in reports, builder, image size)
FAMILIES = {
    "resnet": ("resnet", lambda: tvm.ResNet(tvm.resnet.BasicBlock, [1, 1, 1, 1],
                                            num_classes=10), 32),
    "mobilenet_v2": ("mobilenet_v2", lambda: tvm.MobileNetV2(
        10, width_mult=0.25, inverted_residual_setting=[[1, 16, 1, 1], [6, 24, 2, 2]]), 32),
    "mobilenet_v3": ("mobilenet_v3", _mobilenet_v3, 32),
    "efficientnet": ("efficientnet", _efficientnet, 32),
    "regnet": ("regnet", lambda: tvm.RegNet(tvm.regnet.BlockParams.from_init_params(
        depth=2, w_0=16, w_a=8.0, w_m=2.0, group_width=8), num_classes=10), 32),
    "convnext": ("convnext", _convnext, 32),
    "shufflenet": ("shufflenet_v2", lambda: tvm.ShuffleNetV2([2, 1, 1], [8, 16, 32, 64, 64],
                                                             num_classes=10), 32),
    "densenet": ("densenet", lambda: tvm.DenseNet(8, (2, 2), 16, num_classes=10), 32),
    "vgg": ("vgg_bn", _vgg, 16),  # 2x2 before the 7x7 adaptive pool: a GatherND, left float
    "squeezenet": ("squeezenet1_1", lambda: tvm.squeezenet1_1(num_classes=10), 32),
    "vit": ("vit", lambda: tvm.VisionTransformer(32, 8, 2, 2, 32, 64, num_classes=10), 32),
    "swin": ("swin", lambda: tvm.SwinTransformer([4, 4], 16, [2], [1], [4, 4],
                                                 num_classes=10), 16),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_exports_and_runs_as_int8(family, tmp_path, one_thread):
    from trtqat.stages.zoo import quantize_model, run_ptq

    name, build, size = FAMILIES[family]
    torch.manual_seed(0)
    result = run_ptq(name, size, tmp_path, model=quantize_model(build()), calib_batches=1,
                     batch=4, val_batches=1, engine_threads=1)
    detail = "\n".join([result.error, *result.checks])
    assert result.status == "ok", detail
    assert any(c.startswith("PASS  Q/DQ vs quantizers") for c in result.checks), detail
    assert any(c.startswith("PASS  TensorRT Q/DQ lint: 0 error(s)") for c in result.checks)
    assert not any(c.startswith("FAIL") for c in result.checks), detail
    if family == "vgg":  # the upsampling adaptive pool has no INT8 form: float, with a note
        assert any("avgpool" in n for n in result.notes), result.notes

"""Fixtures of tests/export: models and files exported once per session."""

from __future__ import annotations

import pytest
import torch
from export_testlib import MAX_CALIB, batches, calibrate, make_tiny, settle_batchnorm


@pytest.fixture(scope="session")
def tiny_q():
    return make_tiny()


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory, tiny_q):
    """Every variant of the tiny model, exported once (dynamic batch, opset 17)."""
    from trtqat.export import Exporter

    out = tmp_path_factory.mktemp("tiny")
    exporter = Exporter(tiny_q, batches(1, batch=2, seed=1)[0],
                        validation_data=[(x, None) for x in batches(2, seed=2)])
    results = {v: exporter.export(out / f"tiny-{v}.onnx", v, 17)
               for v in ("fp32", "fp16", "int8", "int8-fp16")}
    return results


def _export_torchvision(tmp_path_factory, arch: str, residual: bool = True):
    import trtqat
    from trtqat.export import export_onnx
    from trtqat.families.cnn.models import build_model

    torch.manual_seed(0)
    if residual:
        model = build_model(arch, 10, quantized=True, quant_desc_input=MAX_CALIB)
    else:  # TensorRT's placement without its residual rule: a file for the lint to flag
        model = trtqat.quantize(build_model(arch, 10),
                                {"quant_desc_input": MAX_CALIB, "residual": False})
    data = batches(2, size=32, batch=8)
    settle_batchnorm(model, data)
    calibrate(model, data)
    path = tmp_path_factory.mktemp(arch) / f"{arch}-ptq-int8.onnx"
    # random weights make ORT-vs-PyTorch comparisons chaotic; these files are for the lint
    export_onnx(model, batches(1, size=32, batch=2)[0], path, "int8", validate=False)
    return path


@pytest.fixture(scope="session")
def resnet50_int8(tmp_path_factory):
    return _export_torchvision(tmp_path_factory, "resnet50")


@pytest.fixture(scope="session")
def mobilenet_v2_int8(tmp_path_factory):
    """MobileNetV2 quantized without residual quantizers (``residual=False``)."""
    return _export_torchvision(tmp_path_factory, "mobilenet_v2", residual=False)


@pytest.fixture(scope="session")
def resnet18_ptq_checkpoint(tmp_path_factory):
    """A calibrated (ptq) ResNet18 checkpoint at 16x16, as `trtqat calibrate` writes it."""
    from trtqat.families.cnn.models import build_model
    from trtqat.runs.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = build_model("resnet18", 10, quantized=True, quant_desc_input=MAX_CALIB)
    data = batches(2, size=16, batch=8)
    settle_batchnorm(model, data)
    calibrate(model, data)
    spec = {"arch": "resnet18", "num_classes": 10, "image_size": 16, "quantized": True,
            "skip_layers": [], "placement": "graph-1"}
    path = tmp_path_factory.mktemp("run") / "best.pt"
    save_checkpoint(path, {"stage": "ptq", "model": spec, "state_dict": model.state_dict()})
    return path


@pytest.fixture(scope="session")
def resnet18_int8(tmp_path_factory, resnet18_ptq_checkpoint):
    """``trtqat export --variant int8`` of the ResNet18 checkpoint (random weights: the
    ORT comparison is chaotic there, so --no-validate; the tiny model covers validation)."""
    from trtqat.cli import main

    out = tmp_path_factory.mktemp("export")
    rc = main(["export", "--checkpoint", str(resnet18_ptq_checkpoint), "--variant", "int8",
               "--out", str(out), "--no-validate"])
    assert rc == 0
    return out / "resnet18-ptq-max-int8.onnx"  # no calib record: max

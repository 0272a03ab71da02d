"""The ViT and detector families re-apply a checkpoint's recorded format when they rebuild
the model (the CNN family: tests/stages/test_format_cli.py; encoders:
tests/families/encoder/test_format.py)."""

from __future__ import annotations

import pytest
import torch

import trtqat
from trtqat import families
from trtqat.quant.descriptor import E4M3
from trtqat.quant.model_ops import quantizers

SIZE = 16


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Compute-bound: one thread."""


def _spec(quantized: bool, **more) -> dict:
    return {"family": "vit", "arch": "vit_tiny", "num_classes": 10, "image_size": SIZE,
            "quantized": quantized, "skip_layers": [], **more}


def test_vit_reapplies_the_format():
    family = families.get("vit")
    torch.manual_seed(0)
    model = family.build("vit_tiny", 10, image_size=SIZE).eval()
    start = family.load({"model": _spec(False, format="fp8"), "state_dict": model.state_dict()},
                        quantized=True)  # the start of PTQ
    assert {q.num_bits for _, q in quantizers(start)} == {E4M3}
    images = torch.randn(2, 3, SIZE, SIZE)
    trtqat.collect_stats(start, [images], progress=False)
    trtqat.compute_amax(start, "mse")  # mse on the FP8 grid
    ckpt = {"model": _spec(True, format="fp8"), "state_dict": start.state_dict()}
    back = family.load(ckpt).eval()
    assert {q.num_bits for _, q in quantizers(back)} == {E4M3}
    with torch.no_grad():
        torch.testing.assert_close(back(images), start.eval()(images))
    del ckpt["model"]["format"]
    assert {q.num_bits for _, q in quantizers(family.load(ckpt))} == {8}


def test_detector_reapplies_the_format():
    family = families.get("detect")
    torch.manual_seed(0)
    model = family.build("yolo_digits", 10)
    spec = {"arch": "yolo_digits", "family": "detect", "num_classes": 10, "quantized": False,
            "skip_layers": [], "source": family.origin("yolo_digits"), "format": "fp8"}
    start = family.load({"model": spec, "state_dict": model.state_dict()}, quantized=True)
    assert {q.num_bits for _, q in quantizers(start)} == {E4M3}
    assert any(q.disabled for _, q in quantizers(start))  # its prediction convs stay float
    back = family.load({"model": {**spec, "quantized": True},
                        "state_dict": start.state_dict()})
    assert {q.num_bits for _, q in quantizers(back)} == {E4M3}

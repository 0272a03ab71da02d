"""FP8 E4M3 fake quantization computes as ONNX's QuantizeLinear/DequantizeLinear do."""

from __future__ import annotations

import pytest
import torch

from trtqat.quant.fp8 import E4M3_MAX, fake_e4m3, fp8_scale, quantize_e4m3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_codes_times_scale_with_a_straight_through_gradient(dtype):
    x = (torch.randn(4, 8, 5, 5, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    x.requires_grad_()
    amax = torch.tensor([2.5, 0.5, 4.0, 1.0]).reshape(4, 1, 1, 1)
    y = fake_e4m3(x, amax)
    scale = fp8_scale(amax)
    codes = quantize_e4m3(x.detach(), scale)
    assert codes.dtype == torch.float8_e4m3fn and codes.float().abs().max() <= E4M3_MAX
    assert y.dtype == dtype and torch.equal(y, (codes.float() * scale).to(dtype))
    y.sum().backward()
    assert torch.equal(x.grad, (x.detach().abs() <= amax.to(dtype)).to(dtype))


def test_saturates_and_keeps_zero_amax_finite():
    x = torch.tensor([1e6, -1e6, 0.3, float("inf")])
    assert fake_e4m3(x, torch.tensor(1.0)).tolist()[:2] == [1.0, -1.0]  # 448 * (1 / 448)
    assert torch.isfinite(fp8_scale(torch.tensor(0.0)))
    assert fake_e4m3(torch.zeros(3), torch.tensor(0.0)).tolist() == [0.0, 0.0, 0.0]


def test_fp8_leaves_small_convs_and_average_pooling_float(caplog):
    import torchvision

    import trtqat
    from trtqat.quant.model_ops import quantizers

    model = torchvision.models.resnet18(num_classes=10).eval()
    with caplog.at_level("WARNING", logger="trtqat"):
        trtqat.quantize(model, {"format": "fp8"})
    off = {n for n, q in quantizers(model) if q.disabled}
    assert {"conv1._input_quantizer", "conv1._weight_quantizer",
            "avgpool._input_quantizer"} <= off  # 3 -> 64 channels, and the pool
    assert not any(n.startswith(("layer1.", "fc.")) for n in off)
    assert "NOTE fp8: 2 layer(s) stay float" in caplog.text and "conv1, avgpool" in caplog.text

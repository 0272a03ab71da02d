"""QuantMatMul: numerics against a numpy reference, straight-through gradient, calibration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtqat.errors import QuantConfigError
from trtqat.quant import QuantDescriptor
from trtqat.quant.model_ops import collect_stats, compute_amax
from trtqat.quant.plugins.matmul import QuantMatMul


def ref_fake_quant(x: np.ndarray, amax: float) -> np.ndarray:
    scale = np.float32(amax) / np.float32(127)
    return (np.clip(np.round(x / scale), -128, 127) * scale).astype(np.float32)  # full range


def _mm(amax_a: float, amax_b: float) -> QuantMatMul:
    return QuantMatMul(QuantDescriptor(amax=amax_a), QuantDescriptor(amax=amax_b))


def test_forward_matches_reference():
    a, b = torch.randn(2, 3, 5, 8) * 2, torch.randn(2, 3, 8, 4)
    mm = _mm(3.0, 1.5)
    want = np.matmul(ref_fake_quant(a.numpy(), 3.0), ref_fake_quant(b.numpy(), 1.5))
    np.testing.assert_allclose(mm(a, b).numpy(), want, rtol=1e-5, atol=1e-5)
    # both operands are quantized: the result differs from the float product
    assert not torch.allclose(mm(a, b), a @ b, atol=1e-3)


def test_gradient_is_straight_through_with_clipping():
    a = (torch.randn(4, 6) * 2).requires_grad_()
    b = torch.randn(6, 3).requires_grad_()
    mm = _mm(2.0, 10.0)
    g = torch.randn(4, 3)
    mm(a, b).backward(g)
    qa = torch.from_numpy(ref_fake_quant(a.detach().numpy(), 2.0))
    qb = torch.from_numpy(ref_fake_quant(b.detach().numpy(), 10.0))
    codes = torch.round(a.detach() / (2.0 / 127))
    inside = ((codes >= -128) & (codes <= 127)).float()
    assert (inside == 0).any(), "the test needs clipped elements"
    torch.testing.assert_close(a.grad, (g @ qb.T) * inside, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.grad, qa.T @ g, rtol=1e-5, atol=1e-5)


def test_calibration_sees_both_operands():
    mm = QuantMatMul()  # default per-tensor descriptor, max calibration

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mm = mm

        def forward(self, x):
            return self.mm(x, x.transpose(-1, -2) * 3)

    x = torch.randn(2, 4, 5)
    model = Wrap()
    collect_stats(model, [x], progress=False)
    compute_amax(model, "max")
    assert float(mm.input_quantizer.amax) == pytest.approx(float(x.abs().max()))
    assert float(mm.other_quantizer.amax) == pytest.approx(float(3 * x.abs().max()), rel=1e-6)


def test_per_channel_descriptor_is_refused():
    with pytest.raises(QuantConfigError, match="per tensor"):
        QuantMatMul(QuantDescriptor(axis=0))
    with pytest.raises(TypeError):
        QuantMatMul("int8")  # type: ignore[arg-type]

"""Fake quantization against reference formulas written here, independently of trtqat."""

import numpy as np
import pytest
import torch

from trtqat.quant.functional import (
    fake_tensor_quant,
    fake_tensor_quant_learnable,
    quant_bounds,
    tensor_quant,
)


def ref_fake_quant(x: np.ndarray, amax: np.ndarray, num_bits: int, unsigned: bool, narrow: bool):
    """Reference in float64 numpy: symmetric, round half to even, clamp."""
    qmax = 2 ** (num_bits - 1 + int(unsigned)) - 1
    qmin = 0 if unsigned else (-qmax if narrow else -qmax - 1)
    scale = amax.astype(np.float32) / np.float32(qmax)
    q = np.round(x.astype(np.float32) / scale)  # numpy rounds half to even
    return (np.clip(q, qmin, qmax) * scale).astype(np.float32), (q >= qmin) & (q <= qmax)


@pytest.mark.parametrize("num_bits,unsigned,narrow", [(8, False, True), (8, False, False),
                                                      (8, True, False), (4, False, True),
                                                      (16, False, True)])
def test_per_tensor_matches_reference(num_bits, unsigned, narrow):
    x = torch.randn(4, 8, 5, 5) * 3
    amax = torch.tensor(2.5)
    y = fake_tensor_quant(x, amax, num_bits, unsigned, narrow)
    ref, _ = ref_fake_quant(x.numpy(), amax.numpy(), num_bits, unsigned, narrow)
    np.testing.assert_allclose(y.numpy(), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_per_channel_any_axis(axis):
    x = torch.randn(3, 4, 5, 6) * 2
    shape = [1] * 4
    shape[axis] = x.shape[axis]
    amax = torch.rand(shape) * 2 + 0.1
    y = fake_tensor_quant(x, amax)
    ref, _ = ref_fake_quant(x.numpy(), amax.numpy(), 8, False, True)
    np.testing.assert_allclose(y.numpy(), ref, rtol=0, atol=1e-6)


def test_ties_round_half_to_even_and_range_edges():
    amax = torch.tensor(127.0)  # scale 1: x are the codes themselves
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.4, 127.5, 200.0, -127.5, -300.0])
    y = fake_tensor_quant(x, amax)
    assert y.tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, 126.0, 127.0, 127.0, 127.0, -127.0, -127.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_computed_in_float32(dtype):
    x = (torch.randn(64, 32) * 2).to(dtype)
    amax = torch.tensor(3.0)
    y = fake_tensor_quant(x, amax)
    assert y.dtype == dtype
    ref, _ = ref_fake_quant(x.float().numpy(), amax.numpy(), 8, False, True)
    np.testing.assert_allclose(y.float().numpy(), torch.from_numpy(ref).to(dtype).float().numpy())


def test_straight_through_gradient_zero_outside_range():
    x = torch.tensor([-3.0, -1.0, 0.2, 0.99, 1.0, 1.003, 1.5, 4.0], requires_grad=True)
    amax = torch.tensor(1.0)
    fake_tensor_quant(x, amax).sum().backward()
    _, mask = ref_fake_quant(x.detach().numpy(), amax.numpy(), 8, False, True)
    assert x.grad.tolist() == mask.astype(np.float32).tolist()
    assert x.grad.tolist() == [0, 1, 1, 1, 1, 1, 0, 0]


def test_gradient_is_identity_when_nothing_clipped():
    x = torch.randn(100, requires_grad=True)
    g = torch.randn(100)
    fake_tensor_quant(x, x.detach().abs().max()).backward(g)
    assert torch.equal(x.grad, g)


def _surrogate(x, amax, qmin, qmax):
    """Differentiable STE surrogate: autograd of this is the straight-through estimate."""
    scale = amax / qmax
    q = x / scale
    r = torch.round(q).detach()
    inside = (r >= qmin) & (r <= qmax)
    ste = q + (r - q).detach()  # value round(q), derivative 1
    return torch.where(inside, ste, torch.clamp(r, qmin, qmax)) * scale


@pytest.mark.parametrize("per_channel", [False, True])
def test_learnable_amax_gradient(per_channel):
    x = torch.randn(6, 5, 4) * 2
    amax0 = torch.rand(6, 1, 1) + 0.5 if per_channel else torch.tensor(1.7)
    g = torch.randn_like(x)
    qmin, qmax = quant_bounds(8, False, True)

    xa, aa = x.clone().requires_grad_(), amax0.clone().requires_grad_()
    fake_tensor_quant_learnable(xa, aa).backward(g)
    xb, ab = x.clone().requires_grad_(), amax0.clone().requires_grad_()
    _surrogate(xb, ab, qmin, qmax).backward(g)
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(aa.grad, ab.grad, rtol=1e-4, atol=1e-4)
    assert aa.grad.shape == amax0.shape


def test_tensor_quant_returns_codes_and_scale():
    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0])
    codes, scale = tensor_quant(x, torch.tensor(1.0))
    assert codes.tolist() == [-127, -127, 0, 64, 127, 127]  # 63.5 rounds to 64 (even)
    assert float(scale) == pytest.approx(127.0)


def test_zero_channel_amax_gives_zero_not_nan():
    w = torch.zeros(2, 3)
    w[1] = torch.tensor([0.5, -1.0, 0.25])
    amax = torch.tensor([[0.0], [1.0]])
    y = fake_tensor_quant(w, amax)
    assert torch.isfinite(y).all() and (y[0] == 0).all()

"""tensor_quant & co., clip, reduce_amax: pytorch-quantization's documented results."""

import pytest
import torch

from trtqat.errors import TrtqatError
from trtqat.nn import functional as QF
from trtqat.tensor_quant import (
    fake_affine_tensor_quant,
    fake_tensor_quant,
    legacy_fake_tensor_quant,
    scaled_e4m3,
    tensor_quant,
)
from trtqat.utils import reduce_amax

X = torch.tensor([-3.0, -1.0, -0.01, 0.0, 0.5, 2.0, 4.0])


def test_tensor_quant_codes_and_scale():
    codes, scale = tensor_quant(X, torch.tensor(2.0))
    assert float(scale) == pytest.approx(127 / 2.0)  # scale = maxbound / amax
    assert codes.tolist() == [-127, -64, -1, 0, 32, 127, 127]  # narrow by default here
    codes, _ = tensor_quant(X, torch.tensor(2.0), 8, False, False)
    assert codes[0] == -128


def test_fake_and_legacy_agree_and_dequantize():
    amax = torch.tensor(2.0)
    ref = tensor_quant(X, amax)[0] / (127 / 2.0)
    torch.testing.assert_close(fake_tensor_quant(X, amax), ref)
    torch.testing.assert_close(legacy_fake_tensor_quant(X, amax), ref)


def test_per_channel_amax_broadcasts():
    x = torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    y = legacy_fake_tensor_quant(x, torch.tensor([[1.0], [4.0]]))
    assert y[0].tolist() == [1.0, -1.0]
    assert y[1, 0].item() == pytest.approx(32 * 4 / 127)


def test_zero_amax_quantizes_to_zero():
    codes, scale = tensor_quant(X, torch.tensor(0.0))
    assert codes.abs().sum() == 0 and float(scale) == 1.0


def test_straight_through_gradient_clips_outside_amax():
    x = X.clone().requires_grad_(True)
    fake_tensor_quant(x, torch.tensor(2.0)).sum().backward()
    assert x.grad.tolist() == [0, 1, 1, 1, 1, 1, 0]


@pytest.mark.parametrize("fn", [tensor_quant, fake_tensor_quant, legacy_fake_tensor_quant])
def test_errors(fn):
    with pytest.raises(TypeError, match="unsigned") as info:
        fn(X, torch.tensor(4.0), 8, True)
    assert isinstance(info.value, TrtqatError)
    with pytest.raises(ValueError, match="Negative values in amax"):
        fn(X, torch.tensor(-1.0))


def test_fake_affine_tensor_quant():
    x = torch.tensor([-1.0, 0.0, 0.5, 3.0, 5.0])
    y = fake_affine_tensor_quant(x, torch.tensor(-1.0), torch.tensor(3.0), 8)
    step = 4.0 / 255
    assert y[0].item() == pytest.approx(-1.0, abs=step / 2)
    assert y[1].item() == 0.0  # zero is exact in affine quantization
    assert y[4].item() == pytest.approx(y[3].item())  # clipped at max_range
    assert (y - x)[:4].abs().max() <= step / 2 + 1e-6


def test_scaled_e4m3_values():
    x = torch.tensor([1.0, 0.3, 17.0, 448.0, 500.0, -2.5, 1e-9])
    assert scaled_e4m3(x).tolist() == [1.0, 0.3125, 16.0, 448.0, 448.0, -2.5, 0.0]
    y = scaled_e4m3(torch.tensor([1.0, 2.0]), torch.tensor(2.0))  # 2.0 maps to 448
    assert y.tolist() == [1.0, 2.0]


def test_clip_forward_and_learnable_gradients():
    lo = torch.tensor(-1.0, requires_grad=True)
    hi = torch.tensor(1.0, requires_grad=True)
    x = torch.tensor([-3.0, -0.5, 0.5, 2.0, 4.0], requires_grad=True)
    y = QF.clip(x, lo, hi)
    assert y.tolist() == [-1.0, -0.5, 0.5, 1.0, 1.0]
    y.sum().backward()
    assert x.grad.tolist() == [0, 1, 1, 0, 0]
    assert (lo.grad.item(), hi.grad.item()) == (1.0, 2.0)


def test_reduce_amax():
    x = torch.tensor([[1.0, -5.0], [3.0, 2.0]])
    assert reduce_amax(x).item() == 5.0 and reduce_amax(x).dim() == 0
    assert reduce_amax(x, axis=0).tolist() == [[3.0, 5.0]]
    assert reduce_amax(x, axis=0, keepdims=False).tolist() == [3.0, 5.0]
    assert reduce_amax(x, axis=(1,)).tolist() == [[5.0], [3.0]]
    assert reduce_amax(x, axis=(0, 1)).dim() == 0
    with pytest.raises(ValueError):
        reduce_amax(x, axis=(0, 1, 2))

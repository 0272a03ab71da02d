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


# pytorch-quantization's documented E4M3 values: -2.0 .. 1.8 in steps of 0.2, unscaled and
# scaled so that amax = 2 maps to 448
E4M3_X = torch.arange(-2.0, 1.9, 0.2).reshape(4, 5)
E4M3_UNSCALED = [[-2.0, -1.75, -1.625, -1.375, -1.25], [-1.0, -0.8125, -0.625, -0.4062, -0.2031],
                 [0.0, 0.2031, 0.4062, 0.625, 0.8125], [1.0, 1.25, 1.375, 1.625, 1.75]]
E4M3_SCALED = [[-2.0, -1.8571, -1.5714, -1.4286, -1.1429], [-1.0, -0.7857, -0.5714, -0.3929, -0.1964],
               [0.0, 0.1964, 0.3929, 0.5714, 0.7857], [1.0, 1.1429, 1.4286, 1.5714, 1.8571]]


def test_scaled_e4m3_documented_results():
    torch.testing.assert_close(scaled_e4m3(E4M3_X, None), torch.tensor(E4M3_UNSCALED), atol=1e-4, rtol=1e-4)
    amax = reduce_amax(E4M3_X, axis=None)
    torch.testing.assert_close(scaled_e4m3(E4M3_X, amax), torch.tensor(E4M3_SCALED), atol=1e-4, rtol=1e-4)
    x = E4M3_X.clone().requires_grad_(True)
    scaled_e4m3(x, None).sum().backward()
    assert bool((x.grad == 1).all())  # straight through inside +-448


def test_fake_affine_full_int8_range_is_exact():
    x = torch.tensor([-1.0, -13.0, -101.0, -128.0, 0.0, 2.0, 5.0, 13.0, 93.0, 111.0, 127.0])
    torch.testing.assert_close(fake_affine_tensor_quant(x, x.min(), x.max()), x)


def test_tensor_quant_fp16_scale_overflow():
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        tensor_quant(torch.randn(16).half(), torch.tensor(1e-4).half(), 8, False)


def test_clip_module_as_documented():
    from trtqat.nn.modules import clip

    x = torch.rand(64)
    assert torch.equal(clip.Clip(torch.tensor(0.3), torch.tensor(0.7))(x), x.clamp(0.3, 0.7))
    with pytest.raises(ValueError, match="must be scalar"):
        clip.Clip(torch.tensor(0.3), torch.tensor(0.7), learn_min=True)
    op = clip.Clip(0.3, 0.7, learn_min=True, learn_max=True)
    x = torch.randn(3, 7, requires_grad=True)
    op(x).sum().backward()
    inside = (x > 0.3) & (x < 0.7)
    assert bool((x.grad[~inside] == 0).all()) and bool((x.grad[inside] == 1).all())
    assert op.clip_value_min.grad.item() == float((x <= 0.3).sum())


def test_fake_tensor_quant_function_apply_matches_fake_tensor_quant_with_ste():
    from trtqat import tensor_quant as pq_tensor_quant

    x = torch.tensor([-3.0, -0.5, 0.3, 0.9, 2.0], requires_grad=True)
    amax = torch.tensor(1.0, requires_grad=True)
    y = pq_tensor_quant.FakeTensorQuantFunction.apply(x, amax, 8, False, False)
    torch.testing.assert_close(y, fake_tensor_quant(x.detach(), 1.0, 8, False, False))
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert amax.grad is None
    with pytest.raises(TypeError):
        pq_tensor_quant.FakeTensorQuantFunction.apply(x.detach(), 1.0, 8, True)  # negative, unsigned


def test_fake_tensor_quant_with_an_amax_that_requires_grad_stays_in_the_graph():
    amax = torch.tensor(1.0, requires_grad=True)
    y = fake_tensor_quant(torch.tensor([0.5, 2.0]), amax)
    assert y.requires_grad
    y.sum().backward()  # pytorch-quantization: no error, and no gradient for amax
    assert amax.grad is None

"""TensorQuantizer behaviours of pytorch-quantization: dynamic amax, scale_amax, clip,
pre_quant_scale, E4M3, setters, stored forms and state loading."""

import numpy as np
import pytest
import torch

from trtqat import nn as quant_nn
from trtqat.errors import TrtqatError
from trtqat.tensor_quant import QuantDescriptor, fake_tensor_quant, scaled_e4m3

X = torch.tensor([[-2.0, 0.5], [0.25, 1.0]])


def test_no_amax_uses_the_input_range_per_tensor_and_per_axis():
    q = quant_nn.TensorQuantizer()
    assert q.amax is None and q.step_size is None
    torch.testing.assert_close(q(X), fake_tensor_quant(X, torch.tensor(2.0), 8, False, False))
    qa = quant_nn.TensorQuantizer(QuantDescriptor(axis=0))
    torch.testing.assert_close(qa(X), fake_tensor_quant(X, torch.tensor([[2.0], [1.0]]), 8, False, False))
    assert qa.amax is None  # nothing is stored


@pytest.mark.parametrize("source", ["fixed", "calibrated", "dynamic"])
def test_scale_amax_applies_to_every_source(source):
    q = quant_nn.TensorQuantizer(QuantDescriptor(scale_amax=0.5, amax=2.0 if source == "fixed" else None))
    if source == "calibrated":
        q.enable_calib()
        q(X)
        q.disable_calib()
        q.load_calib_amax()
        assert float(q.amax) == 2.0  # stored unscaled
    torch.testing.assert_close(q(X), fake_tensor_quant(X, torch.tensor(1.0), 8, False, False))


def test_pre_quant_scale_multiplies_before_calibration_and_quantization():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=4.0))
    assert q.pre_quant_scale is None
    q.pre_quant_scale = torch.tensor([2.0, 1.0])
    torch.testing.assert_close(q(X), fake_tensor_quant(X * torch.tensor([2.0, 1.0]), torch.tensor(4.0), 8, False, False))
    assert "_pre_quant_scale" in q.state_dict()
    r = quant_nn.TensorQuantizer()
    r.load_state_dict(q.state_dict())
    assert r.pre_quant_scale.tolist() == [2.0, 1.0]


def test_learn_amax_trains_the_clip_range():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0, learn_amax=True))
    assert isinstance(q.clip, quant_nn.Clip) and q._if_clip and q.learn_amax
    assert (q.clip.clip_value_min.item(), q.clip.clip_value_max.item()) == (-1.0, 1.0)
    x = torch.linspace(-3, 3, 101)
    q(x).sum().backward()
    assert q.clip.clip_value_max.grad.item() > 0  # PACT gradient of the clipped elements
    q.disable_clip()
    assert not q.clip.clip_value_max.requires_grad
    plain = quant_nn.TensorQuantizer()
    with pytest.raises(ValueError, match="learn_amax"):
        plain.enable_clip()


def test_init_learn_amax_copies_amax_into_clip():
    q = quant_nn.TensorQuantizer(QuantDescriptor(learn_amax=True))
    q.amax = 3.0
    q.init_learn_amax()
    assert (q.clip.clip_value_min.item(), q.clip.clip_value_max.item()) == (-3.0, 3.0)


def test_e4m3_quantizer():
    q = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=(4, 3), amax=448.0))
    x = torch.tensor([0.3, 17.0, 1000.0])
    assert q(x).tolist() == scaled_e4m3(x, torch.tensor(448.0)).tolist() == [0.3125, 16.0, 448.0]


def test_setters_change_the_range():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    q.num_bits = 4
    assert (q.num_bits, q.maxbound, q.minbound) == (4, 7, -8)
    q.unsigned = True
    assert (q.unsigned, q.minbound, q.maxbound) == (True, 0, 15)
    assert q(torch.tensor([0.6])).item() == pytest.approx(9 / 15)
    q.narrow_range = True
    assert q.narrow_range
    with pytest.raises(TypeError):
        q.num_bits = "eight"


def test_amax_forms_and_setter_errors():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=2.0))
    assert q.amax.shape == () and q.amax.dtype == torch.float32
    assert q.axis is None
    assert quant_nn.TensorQuantizer(QuantDescriptor(axis=(1,))).axis == (1,)
    with pytest.raises(TypeError) as info:
        q.amax = "two"
    assert isinstance(info.value, TrtqatError)
    with pytest.raises(TypeError, match="shape"):
        q.amax = [1.0, 2.0]


def test_unsigned_quantizer_refuses_negative_input():
    q = quant_nn.TensorQuantizer(QuantDescriptor(unsigned=True, amax=1.0))
    with pytest.raises(TypeError, match="unsigned"):
        q(torch.tensor([-0.5, 0.5]))


@pytest.mark.parametrize("stored", [torch.tensor(1.5), torch.full((2, 1), 1.5), torch.tensor([1.5])])
def test_state_dict_loads_amax_of_any_shape(stored):
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=[1.0, 2.0]))
    q.load_state_dict({"_amax": stored})
    assert q.amax.shape == stored.shape
    fresh = quant_nn.TensorQuantizer()  # no amax yet: created by loading
    fresh.load_state_dict({"_amax": stored})
    assert torch.equal(fresh.amax, stored)


def test_real_quantization_returns_codes_and_keeps_scale():
    q = quant_nn.TensorQuantizer(QuantDescriptor(fake_quant=False, amax=2.0))
    codes = q(torch.cat([X, torch.tensor([[-3.0, 0.0]])]))
    assert codes.tolist() == [[-127.0, 32.0], [16.0, 64.0], [-128.0, 0.0]]  # full range
    assert float(q.scale) == pytest.approx(63.5)


def test_calibrator_shape_change_is_a_runtime_error():
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=0))
    q.enable_calib()
    q.disable_quant()
    q(torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="shape"):
        q(torch.ones(4, 3))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="pytorch-quantization runs this through its CUDA extension; needs a GPU")
def test_cuda_tensors_match_cpu():
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=0, amax=[[2.0], [1.0]])).cuda()
    torch.testing.assert_close(q(X.cuda()).cpu(), q.cpu()(X))


def test_documented_pre_quant_scale_results():
    desc = QuantDescriptor(axis=1, num_bits=8, amax=127.0)  # scale 1: outputs are the codes
    inputs = torch.tensor([[0, 0.4, 1.1, 2.0]])
    q, q2 = quant_nn.TensorQuantizer(desc), quant_nn.TensorQuantizer(desc)
    assert q(inputs).tolist() == [[0, 0, 1, 2]]
    q.pre_quant_scale = 2.0
    assert q(inputs).tolist() == [[0, 1, 2, 4]]
    q2.pre_quant_scale = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert q2(inputs).tolist() == [[0, 1, 3, 8]]


def test_clip_stage_only():
    x = torch.rand(64)
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=0.5, learn_amax=True), if_quant=False, if_clip=True)
    assert torch.equal(q(x), x.clamp(-0.5, 0.5))


def test_properties_and_dynamic_per_channel_scale_amax():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=3.14))
    q.amax = 0.577
    assert q.amax.item() == pytest.approx(0.577) and q.step_size.item() == pytest.approx(0.577 / 127)
    q2 = quant_nn.TensorQuantizer()
    q2.amax = np.array([3.142, 2.718], dtype=np.float32)
    assert q2.amax.tolist() == pytest.approx([3.142, 2.718])
    x = torch.rand(4, 3, 2, 2)
    real = quant_nn.TensorQuantizer(QuantDescriptor(axis=(0), fake_quant=False, scale_amax=0.7))
    amax = 0.7 * x.amax(dim=(1, 2, 3), keepdim=True)
    assert torch.equal(real(x), torch.clamp(torch.round(x * 127 / amax), -128, 127))


def test_e4m3_per_channel_uses_the_channel_ranges():
    q = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=(4, 3), axis=1))
    x = torch.rand(3, 5, 2, 2)
    # the quantizer computes as ONNX's FP8 Q/DQ does (x / (amax/448)), pytorch-quantization's
    # scaled_e4m3 as x * (448/amax): the same codes, outputs within one float32 rounding
    torch.testing.assert_close(q(x), scaled_e4m3(x, q._get_amax(x)), atol=0, rtol=2.5e-7)
    assert q._get_amax(x).shape == (1, 5, 1, 1)


def test_zero_bits_quantize_to_zeros():
    assert quant_nn.TensorQuantizer(QuantDescriptor(num_bits=0))(X).abs().sum() == 0


def test_dynamic_amax_with_every_axis_kept_is_elementwise():
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=(0, 1)))
    assert q._get_amax(X).tolist() == X.abs().tolist()


def test_learned_range_still_used_after_disable_clip():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=0.5, learn_amax=True))
    q.disable_clip()
    x = torch.tensor([0.25, 2.0])
    assert q(x).tolist() == pytest.approx([round(0.25 * 127 / 0.5) * 0.5 / 127, 0.5])


def test_amax_broadcast_check_matches_torch_broadcasting():
    """The per-call amax shape check (plain Python on sizes) agrees with torch's rule."""
    import itertools

    from trtqat.quant.amax import broadcasts

    for la, lb in itertools.product(range(4), range(4)):
        for a in itertools.product([1, 2, 3], repeat=la):
            for b in itertools.product([1, 2, 3], repeat=lb):
                try:
                    expected = torch.broadcast_shapes(torch.Size(a), torch.Size(b)) == b
                except RuntimeError:
                    expected = False
                assert broadcasts(torch.Size(a), torch.Size(b)) == expected, (a, b)

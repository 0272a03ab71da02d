"""TensorQuantizer: the pytorch-quantization API, calibration switches, errors, state."""

import pytest
import torch

from trtqat import nn as quant_nn
from trtqat.errors import CalibrationError, QuantConfigError, QuantizerStateError, QuantTypeError
from trtqat.tensor_quant import QuantDescriptor


def test_api_surface_and_defaults():
    q = quant_nn.TensorQuantizer()
    assert (q.num_bits, q.axis, q.unsigned, q.narrow_range) == (8, None, False, False)
    assert (q.minbound, q.maxbound) == (-128, 127)  # full range by default
    assert q.amax is None and q._calibrator is not None
    for name in ("enable", "disable", "enable_quant", "disable_quant", "enable_calib",
                 "disable_calib", "load_calib_amax"):
        assert callable(getattr(q, name))
    assert "8bit" in repr(q) and "amax=dynamic" in repr(q)


def test_calibrate_then_quantize():
    q = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=8))
    x = torch.linspace(-3, 2, 101)
    q.disable_quant()
    q.enable_calib()
    assert torch.equal(q(x), x)  # calibrating passes data through
    q.load_calib_amax()
    q.disable_calib()
    q.enable_quant()
    assert float(q.amax) == 3.0
    y = q(x)
    assert not torch.equal(y, x) and (y - x).abs().max() <= 3.0 / 127 / 2 + 1e-6
    q.disable()
    assert q(x) is x


def test_amax_setter_and_per_channel():
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=(0,)))
    w = torch.randn(4, 3, 3, 3)
    q.enable_calib()
    q.disable_quant()
    q(w)
    q.load_calib_amax()
    assert q.amax.shape == (4, 1, 1, 1)
    torch.testing.assert_close(q.amax.flatten(), w.abs().amax(dim=(1, 2, 3)))
    with pytest.raises(QuantTypeError, match="shape"):
        q.amax = 2.0  # changing the shape is refused, as in pytorch-quantization
    q.amax = torch.full((4, 1, 1, 1), 2.0)
    assert q.amax.flatten().tolist() == [2.0] * 4


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0])
def test_bad_amax_is_refused_with_a_clear_message(bad):
    q = quant_nn.TensorQuantizer()
    with pytest.raises(QuantizerStateError, match="amax"):
        q.amax = bad


def test_quantizing_without_amax_uses_the_input_range():
    q = quant_nn.TensorQuantizer()
    x = torch.tensor([-2.0, 0.3, 1.0])
    assert torch.allclose(q(x), quant_nn.TensorQuantizer(QuantDescriptor(amax=2.0))(x))


def test_calibrating_with_no_data():
    q = quant_nn.TensorQuantizer()
    with pytest.raises(CalibrationError, match="no data"):
        q.load_calib_amax()


@pytest.mark.parametrize("bits,error", [(-1, ValueError), (8.0, TypeError), (True, TypeError),
                                        ((5, 2), TypeError)])
def test_bad_num_bits(bits, error):
    with pytest.raises(error, match="num_bits"):
        QuantDescriptor(num_bits=bits)


def test_axis_out_of_range():
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=(4,)))
    q.enable_calib()
    q.disable_quant()
    with pytest.raises(QuantConfigError, match="axis 4 is out of range"):
        q(torch.ones(2, 2))


def test_state_dict_round_trip_and_shape_mismatch():
    a = quant_nn.QuantConv2d(3, 4, 3)
    a.input_quantizer.amax = 1.5
    a.weight_quantizer.amax = torch.rand(4, 1, 1, 1) + 0.1
    b = quant_nn.QuantConv2d(3, 4, 3)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.weight_quantizer.amax, a.weight_quantizer.amax)
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(a(x), b(x))
    c = quant_nn.QuantConv2d(3, 4, 3)
    c.weight_quantizer.amax = torch.rand(4, 1, 1, 1) + 0.1
    state = a.state_dict()
    state["_weight_quantizer._amax"] = torch.tensor(0.5)  # per-tensor into per-channel
    c.load_state_dict(state)
    assert c.weight_quantizer.amax.shape == () and float(c.weight_quantizer.amax) == 0.5
    state["_weight_quantizer._amax"] = torch.rand(8, 1, 1, 1)  # loads; fails when used
    c.load_state_dict(state)
    with pytest.raises(QuantizerStateError, match="shape"):
        c(x)


def test_lsq_learned_amax_is_trained():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    q.init_learn_amax()  # trtqat extension: amax itself becomes a parameter
    assert isinstance(q._amax, torch.nn.Parameter) and q.learn_amax
    x = torch.randn(1000) * 2
    opt = torch.optim.SGD(q.parameters(), lr=0.01)
    before = float(q.amax)
    for _ in range(20):
        opt.zero_grad()
        ((q(x) - x) ** 2).mean().backward()
        opt.step()
    assert float(q.amax) > before  # clipping error dominates: the range grows

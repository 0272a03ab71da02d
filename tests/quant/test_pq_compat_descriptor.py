"""QuantDescriptor as pytorch-quantization defines it: defaults, stored forms, errors, YAML."""

import numpy as np
import pytest

from trtqat.errors import TrtqatError
from trtqat.tensor_quant import (
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
    ScaledQuantDescriptor,
)


def test_defaults_are_full_range_per_tensor():
    d = QuantDescriptor()
    assert (d.num_bits, d.name, d.fake_quant, d.axis, d.amax) == (8, None, True, None, None)
    assert (d.learn_amax, d.scale_amax, d.calib_method, d.unsigned) == (False, None, "max", False)
    assert d.narrow_range is False and (d.min_bound, d.max_bound) == (-128, 127)
    assert ScaledQuantDescriptor is QuantDescriptor


def test_axis_and_amax_are_stored_as_given():
    assert QuantDescriptor(axis=(0)).axis == 0
    assert QuantDescriptor(axis=(0, 1)).axis == (0, 1)
    assert QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL.axis == 0
    amax = QuantDescriptor(amax=1.5).amax
    assert isinstance(amax, np.ndarray) and amax.dtype == np.float32 and amax.shape == ()
    assert QuantDescriptor(amax=[1.0, 2.0]).amax.tolist() == [1.0, 2.0]


def test_presets():
    assert QUANT_DESC_8BIT_PER_TENSOR == QuantDescriptor(num_bits=8)
    assert QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned


@pytest.mark.parametrize("kwargs,error", [
    ({"num_bits": -1}, ValueError),
    ({"num_bits": 8.0}, TypeError),
    ({"num_bits": (5, 2)}, TypeError),
    ({"name": 3}, TypeError),
    ({"amax": "big"}, TypeError),
    ({"bogus": 1}, TypeError),
    ({"learn_amax": True, "axis": 0}, TypeError),
    ({"calib_method": "magic"}, ValueError),
])
def test_errors_have_the_same_types(kwargs, error):
    with pytest.raises(error) as info:
        QuantDescriptor(**kwargs)
    assert isinstance(info.value, TrtqatError)


def test_dict_holds_only_non_defaults_and_round_trips():
    d = QuantDescriptor(num_bits=4, name="w", axis=(0,), amax=[1.0, 2.0], unsigned=True)
    assert d.dict() == {"num_bits": 4, "name": "w", "axis": (0,), "amax": [1.0, 2.0],
                        "unsigned": True}
    assert QuantDescriptor(**d.dict()) == d


@pytest.mark.parametrize("desc", [
    QuantDescriptor(num_bits=8, name="x", axis=(0,), amax=[0.5, 1.5], scale_amax=2.0),
    QuantDescriptor(num_bits=(4, 3), narrow_range=True, calib_method="histogram"),
    QuantDescriptor(learn_amax=True, amax=2.0, fake_quant=False),
])
def test_yaml_round_trip(desc):
    text = desc.to_yaml()
    assert "num_bits" in text
    assert QuantDescriptor.from_yaml(text) == desc


def test_e4m3_and_zero_bit_descriptors():
    assert QuantDescriptor(num_bits=(4, 3)).num_bits == (4, 3)
    assert QuantDescriptor(num_bits=(4, 3), axis=1).axis == 1
    for e, m in ((5, 2), (7, 3)):
        with pytest.raises(TypeError):
            QuantDescriptor(num_bits=(e, m))
    assert QuantDescriptor(num_bits=0).num_bits == 0  # allowed (debugging: all zeros)

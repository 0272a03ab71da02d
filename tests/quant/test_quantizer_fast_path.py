"""The quantizer's path decided once per state (issue 35): bit-identical numerics, a cache that
follows every change of state, and every error still raised."""

from __future__ import annotations

import copy
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch

from trtqat import nn as quant_nn
from trtqat.errors import (
    AmaxValueError,
    CalibrationError,
    QuantInputError,
    QuantizerStateError,
    QuantTypeError,
)
from trtqat.quant import _fused, _kernels, export_mode
from trtqat.quant.functional import quant_bounds
from trtqat.tensor_quant import QuantDescriptor

HERE = Path(__file__).resolve().parent


def _reference(x, amax, g, bits, unsigned, narrow):
    """Today's numerics: the pure-PyTorch formulas (value, input gradient)."""
    qmin, qmax = quant_bounds(bits, unsigned, narrow)
    y, _ = _fused.fake_quant_forward(x, amax, qmin, qmax)
    return y, _fused.fake_quant_grad_input(g, x, amax, qmin, qmax)


def _data(axis, unsigned, dtype, channels_last=False):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 5, 3, generator=gen) * 2
    if unsigned:
        x = x.abs()
    if axis is None:
        amax = x.abs().amax() * 0.6  # some elements clip: the masked backward runs
    else:
        amax = x.abs().amax(dim=(0, 2, 3), keepdim=True) * 0.6
    x = x.to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, amax, torch.randn(x.shape, generator=gen).to(dtype)


@pytest.mark.parametrize("axis", [None, (1,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits,unsigned,narrow", [(8, False, True), (8, True, False),
                                                  (4, False, False)])
def test_values_and_gradients_are_bit_identical(backend, axis, dtype, bits, unsigned, narrow):
    x, amax, g = _data(axis, unsigned, dtype, channels_last=axis is None)
    q = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=bits, axis=axis, unsigned=unsigned,
                                                 narrow_range=narrow))
    q.amax = amax
    y_ref, g_ref = _reference(x, amax, g, bits, unsigned, narrow)
    for _ in range(2):  # the deciding call and a cached one
        leaf = x.clone().requires_grad_(True)
        y = q(leaf)
        y.backward(g)
        assert y.dtype == dtype and torch.equal(y.detach(), y_ref)
        assert torch.equal(leaf.grad, g_ref)
        with torch.no_grad():
            assert torch.equal(q(x), y_ref)
    compiled = backend == "fastest" and _kernels.hot_kernel()
    # float32 and bfloat16 ran the compiled entry point (a C++ autograd node), pure PyTorch
    # the Python one
    assert ("_FakeQuantFn" not in type(y.grad_fn).__name__) == bool(compiled)
    leaf = x.clone().requires_grad_(True)  # an expanded gradient (y.sum()): another layout
    q(leaf).sum().backward()
    assert torch.equal(leaf.grad, _reference(x, amax, torch.ones_like(x), bits, unsigned,
                                             narrow)[1])
    leaf = x.clone().requires_grad_(True)  # no element clipped: identity backward
    q.amax = x.detach().float().abs().amax(dim=None if axis is None else (0, 2, 3),
                                           keepdim=axis is not None) * 2
    q(leaf).backward(g)
    assert torch.equal(leaf.grad, g)


def test_learned_amax_is_bit_identical(backend):
    x, amax, g = _data(None, False, torch.float32)
    q = quant_nn.TensorQuantizer(QuantDescriptor())
    q.amax = amax
    q.init_learn_amax()
    leaf = x.clone().requires_grad_(True)
    q(leaf).backward(g)
    y, _ = _fused.fake_quant_forward(x, amax, -128, 127)
    grad_x, grad_amax = _fused.learnable_grad(g, x, amax, -128, 127)
    assert torch.equal(q(x).detach(), y)
    assert torch.equal(leaf.grad, grad_x) and torch.equal(q._amax.grad, grad_amax)


def test_the_cache_follows_every_change_of_state(backend):
    x = torch.linspace(-3, 3, 49).reshape(1, 1, 7, 7)
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))

    def expect(amax, bits=8, unsigned=False, narrow=False):
        ref, _ = _reference(x, torch.tensor(amax), x, bits, unsigned, narrow)
        assert torch.equal(q(x), ref)

    expect(1.0)
    q.amax = torch.tensor(2.0)
    expect(2.0)
    q._amax.mul_(0.5)  # in place: the same tensor, a new version
    expect(1.0)
    q.load_state_dict({"_amax": torch.tensor(1.5)})
    expect(1.5)
    q.num_bits = 4
    expect(1.5, bits=4)
    q.narrow_range = True
    expect(1.5, bits=4, narrow=True)
    q.disable()
    assert q(x) is x
    q.enable()
    expect(1.5, bits=4, narrow=True)
    q.disable_quant()
    assert q(x) is x
    q.enable_quant()
    q._num_bits = 8  # a private write (pytorch-quantization programs do this) counts too
    expect(1.5, narrow=True)
    q.pre_quant_scale = torch.tensor(0.5)
    assert torch.equal(q(x), _reference(x * 0.5, torch.tensor(1.5), x, 8, False, True)[0])
    q.pre_quant_scale = None
    expect(1.5, narrow=True)
    with export_mode.enabled():  # torch's fake-quantize op while exporting
        exported = q(x)
    assert torch.equal(exported, export_mode.fake_quant_for_export(
        x, torch.tensor(1.5), -127, 127, None))
    quant_nn.TensorQuantizer.use_fb_fake_quant = True
    try:
        assert torch.equal(q(x), exported)
    finally:
        quant_nn.TensorQuantizer.use_fb_fake_quant = False
    expect(1.5, narrow=True)
    q.double()  # .to(): a new amax tensor (float64: the general path)
    assert q._amax.dtype == torch.float64 and torch.equal(q(x), _reference(
        x, torch.tensor(1.5, dtype=torch.float64), x, 8, False, True)[0])


def test_an_amax_made_in_inference_mode_has_no_version_and_still_works():
    q = quant_nn.TensorQuantizer(QuantDescriptor())
    x = torch.linspace(-2, 2, 9)
    with torch.inference_mode():
        q.amax = torch.tensor(1.0)  # an inference tensor: reading its _version raises
        inside = q(x)
    ref = _reference(x, torch.tensor(1.0), x, 8, False, False)[0]
    assert torch.equal(inside, ref) and torch.equal(q(x), ref)
    q.amax = torch.tensor(2.0)
    assert torch.equal(q(x), _reference(x, torch.tensor(2.0), x, 8, False, False)[0])


def test_per_channel_amax_and_axis_changes_follow():
    x = torch.randn(2, 4, 3, 3)
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=(1,)))
    q.amax = torch.ones(1, 4, 1, 1)
    assert torch.equal(q(x), _reference(x, torch.ones(1, 4, 1, 1), x, 8, False, False)[0])
    q.load_state_dict({"_amax": torch.full((2, 1, 1, 1), 0.5)})  # another axis and shape
    q._axis = (0,)
    assert torch.equal(q(x), _reference(x, torch.full((2, 1, 1, 1), 0.5), x, 8, False,
                                        False)[0])
    q.note = "any attribute write resets the decision"
    assert q._hot is None


def test_switching_the_kernels_redecides():
    x = torch.randn(1, 8, 4, 4)
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    q(x)
    before = _kernels._forced or None
    try:
        _kernels.set_backend("pytorch")
        q(x)
        assert q._hot[3] is None  # no compiled entry point with the pure-PyTorch kernels
        _kernels.set_backend(None)
        q(x)
        assert (q._hot[3] is not None) == (_kernels.hot_kernel() is not None)
    finally:
        _kernels.set_backend(before)


def test_setting_the_same_kernels_again_keeps_every_decision():
    """A benchmark or loop that sets the backend each step must not make every quantizer
    decide again (on a GPU the decision's checks would stall the stream at each step)."""
    before = _kernels._forced or None
    try:
        _kernels.set_backend(None)
        epoch = _kernels.EPOCH
        _kernels.set_backend(None)
        assert _kernels.EPOCH == epoch
        _kernels.set_backend("pytorch")
        assert _kernels.EPOCH == epoch + 1
    finally:
        _kernels.set_backend(before)


def test_deciding_reads_no_value_of_an_amax_off_the_cpu():
    """The decision reads amax values on the CPU only: on a GPU a host read stalls every
    re-decision and breaks CUDA-graph capture (a meta amax has no values to read)."""
    from trtqat.quant import fast_path
    from trtqat.quant.tensor_quantizer import _int_bounds

    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    amax = torch.empty((), device="meta")
    hot = fast_path.decide(q, amax, _int_bounds)
    assert hot[7] and hot[3] is None  # the plain path, no compiled CPU entry point


def test_errors_are_still_raised(backend):
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    q(torch.randn(4))
    with pytest.raises(AmaxValueError, match="NaN or inf"):
        q.amax = torch.tensor(float("nan"))
    q._amax.fill_(float("inf"))  # in place, after the check on assignment
    with pytest.raises(AmaxValueError, match="NaN or inf"):
        q(torch.randn(4))
    with pytest.raises(AmaxValueError, match="NaN or inf"):  # every call, not only the first
        q(torch.randn(4))
    q.amax = torch.tensor(1.0)
    with pytest.raises(QuantInputError, match="floating-point"):
        q(torch.arange(4))
    with pytest.raises(QuantInputError, match="torch.Tensor"):
        q([1.0, 2.0])
    unsigned = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0, unsigned=True))
    unsigned(torch.rand(1, 8, 4, 4))
    with pytest.raises(QuantTypeError, match="Negative values"):
        unsigned(-torch.rand(1, 8, 4, 4).requires_grad_(True))
    with pytest.raises(QuantTypeError, match="Negative values"):
        unsigned(torch.tensor([0.5, -1e-9]))  # rounds to 0, still refused
    per_channel = quant_nn.TensorQuantizer(QuantDescriptor(axis=(0,), amax=[1.0, 2.0, 3.0]))
    with pytest.raises(QuantizerStateError, match="does not fit"):
        per_channel(torch.randn(2, 4))
    calibrating = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0, calib_method="histogram"))
    calibrating.enable_calib()
    with pytest.raises(CalibrationError, match="NaN or inf"):
        calibrating(torch.tensor([1.0, float("nan")]))


def test_a_called_quantizer_copies_and_pickles():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    x = torch.randn(3, 5)
    y = q(x)
    assert q._hot is not None
    for clone in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert torch.equal(clone(x), y)


def test_quantizer_matches_the_triton_kernels_in_the_interpreter():
    pytest.importorskip("triton")
    sys.path.insert(0, str(HERE))
    from triton_cases import run_in_interpreter

    results = run_in_interpreter(HERE / "fast_path_triton_cases.py")
    assert results and all(v == "ok" for v in results.values()), results


def test_an_extension_built_from_an_older_source_keeps_the_python_path(monkeypatch):
    if _kernels._C is None:
        pytest.skip("no compiled CPU kernel here")
    old = types.SimpleNamespace(fake_quant_forward=_kernels._C.fake_quant_forward,
                                fake_quant_grad_input=_kernels._C.fake_quant_grad_input,
                                __file__="_C.so")  # no fake_quant_apply
    monkeypatch.setattr(_kernels, "_C", old)
    _kernels._names()  # what a change of kernels does: quantizers decide again
    try:
        x, amax, g = _data((1,), False, torch.float32)
        q = quant_nn.TensorQuantizer(QuantDescriptor(axis=(1,)))
        q.amax = amax
        leaf = x.clone().requires_grad_(True)
        y = q(leaf)
        y.backward(g)
        assert q._hot[3] is None and "_FakeQuantFn" in type(y.grad_fn).__name__
        y_ref, g_ref = _reference(x, amax, g, 8, False, False)
        assert torch.equal(y.detach(), y_ref) and torch.equal(leaf.grad, g_ref)
        assert "rebuild" in _kernels.kernel_report()["cpu"]
    finally:
        monkeypatch.undo()
        _kernels._names()


def test_jit_trace_records_the_quantizer_not_a_constant():
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    x = torch.linspace(-2, 2, 9)
    q(x)  # decided (the compiled path) before tracing
    traced = torch.jit.trace(q, (x,), check_trace=False)
    other = torch.linspace(-0.5, 0.5, 9)
    assert torch.equal(traced(other), q(other))

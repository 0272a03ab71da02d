"""The calibrated fake-quant forward, a QAT step's hot path (issue 14): a TensorQuantizer adds
no tensor op and no slow attribute lookup to the kernel's own work, and every stage that is
switched on still applies."""

import collections
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trtqat import nn as quant_nn
from trtqat.errors import QuantizerStateError
from trtqat.quant import _kernels
from trtqat.tensor_quant import QuantDescriptor


class _Ops(TorchDispatchMode):
    """Counts the aten ops dispatched inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _calibrated(axis, unsigned: bool = False):
    q = quant_nn.TensorQuantizer(QuantDescriptor(axis=axis, unsigned=unsigned))
    x = torch.randn(8, 4, 5, 5)
    if unsigned:
        x = x.abs()
    amax = x.abs().amax(dim=(1, 2, 3), keepdim=True) if axis is not None else x.abs().amax()
    q.amax = amax * 0.5  # some elements clip: the masked backward is exercised too
    return q, x


@pytest.mark.parametrize("axis", [None, (0,)])
@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_calibrated_forward_dispatches_only_the_kernel_ops(backend, axis, unsigned, grad):
    q, x = _calibrated(axis, unsigned)
    amax, qmin, qmax = q.amax, q.minbound, q.maxbound
    plain = x.clone()
    x.requires_grad_(grad)
    q(x)  # the first call decides the path (and checks amax) once for this state
    with _Ops() as kernel:
        ref, _ = _kernels.fake_quant_forward(plain, amax, qmin, qmax)
    with _Ops() as quantizer:
        y = q(x)
    extra = collections.Counter(quantizer.ops)
    extra.subtract(kernel.ops)
    if unsigned and _kernels.hot_kernel() is None:  # pytorch-quantization's negative-input
        # check, one reduction (the compiled kernel checks in its own loop)
        for op in ("aten.min.default", "aten.lt.Scalar", "aten._local_scalar_dense.default"):
            assert extra.pop(op) == 1
        assert extra.pop("aten.detach.default", 0) == int(grad)  # min()'s autograd node
    # no amax.detach() / .float() / .to(), no min() for a signed range, no scale_amax multiply
    assert +extra == collections.Counter(), dict(+extra)
    assert torch.equal(y.detach(), ref)
    if grad:
        y.sum().backward()
        assert torch.equal(x.grad, ((plain / (amax / qmax)).round().clamp(qmin - 1, qmax + 1)
                                    .clamp(qmin, qmax) == (plain / (amax / qmax)).round()).float())


def test_calibrated_forward_reads_no_attribute_through_module_getattr():
    q, x = _calibrated((0,))
    x.requires_grad_(True)
    q(x)
    called = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            called[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        q(x)
    finally:
        sys.setprofile(None)
    assert called["quantizer_call"] >= 1  # the profile saw the call
    assert called["__getattr__"] == 0  # nn.Module.__getattr__: a microsecond per buffer read
    assert called["is_in_onnx_export"] == 0  # two imports per call
    assert called["__instancecheck__"] == 0  # isinstance(_, nn.Parameter) is Python-level


def test_onnx_export_flags_match_torch():
    from trtqat.quant.functional import onnx_exporting

    globals_mod = pytest.importorskip("torch.onnx._internal.torchscript_exporter._globals")
    flags = pytest.importorskip("torch.onnx._internal.exporter._flags")
    assert onnx_exporting() is False and torch.onnx.is_in_onnx_export() is False
    for module, name in ((globals_mod.GLOBALS, "in_onnx_export"), (flags, "_is_onnx_exporting")):
        before = getattr(module, name)
        setattr(module, name, True)
        try:
            assert onnx_exporting() is True and torch.onnx.is_in_onnx_export() is True
            q = quant_nn.TensorQuantizer()  # no amax: the export path warns about it
            with pytest.warns(UserWarning, match="never calibrated"):
                q(torch.randn(4))
        finally:
            setattr(module, name, before)


def test_a_subclass_overriding_a_stage_keeps_it():
    class Doubling(quant_nn.TensorQuantizer):
        def _quant_forward(self, inputs):
            return 2 * super()._quant_forward(inputs)

    x = torch.linspace(-1, 1, 11)
    plain = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    assert torch.equal(Doubling(QuantDescriptor(amax=1.0))(x), 2 * plain(x))


def test_every_switched_on_stage_still_applies_with_a_stored_amax():
    x = torch.linspace(-2, 2, 41)
    base = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    scaled = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0, scale_amax=2.0))
    assert torch.equal(scaled(x), quant_nn.TensorQuantizer(QuantDescriptor(amax=2.0))(x))
    pre = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    pre.pre_quant_scale = torch.tensor(0.5)
    assert torch.equal(pre(x), base(x * 0.5))
    narrow = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0, narrow_range=True))
    assert float(narrow(torch.tensor(-5.0))) == -1.0 and float(base(torch.tensor(-5.0))) < -1.0
    calib = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    calib.enable_calib()
    calib(x)
    assert calib._calibrator.compute_amax() is not None
    with pytest.raises(QuantizerStateError, match="does not fit"):
        quant_nn.TensorQuantizer(QuantDescriptor(axis=(0,), amax=[1.0, 2.0, 3.0]))(torch.randn(2, 4))

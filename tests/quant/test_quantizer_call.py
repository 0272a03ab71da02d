"""TensorQuantizer.__call__ goes straight to the compiled kernel (issue 35, host-light hot
path), so everything nn.Module.__call__ does must still happen whenever it matters: hooks,
torch.fx's patched call, and the C++ autograd node must save and release like torch's own."""

import sys

import pytest
import torch
from torch import fx, nn

from trtqat import nn as quant_nn
from trtqat.quant import _kernels
from trtqat.tensor_quant import QuantDescriptor

needs_kernel = pytest.mark.skipif(_kernels.hot_kernel() is None,
                                  reason="needs the compiled CPU kernel (trtqat._C)")


def _hot_quantizer() -> tuple[quant_nn.TensorQuantizer, torch.Tensor]:
    x = torch.linspace(-2, 2, 16).reshape(1, 1, 4, 4)
    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))  # |x| > 1 clips
    q(x)  # decided: the next calls take the kernel straight away
    assert q._hot is not None and q._hot[3] is not None
    return q, x


@needs_kernel
def test_a_decided_quantizer_calls_the_kernel_without_its_forward():
    q, x = _hot_quantizer()
    called = []
    sys.setprofile(lambda frame, event, arg: called.append(frame.f_code.co_name)
                   if event == "call" else None)
    try:
        y = q(x)
    finally:
        sys.setprofile(None)
    assert "quantizer_call" in called and "forward" not in called, called
    assert torch.equal(y, q.forward(x))


@needs_kernel
def test_hooks_still_run_on_a_decided_quantizer():
    q, x = _hot_quantizer()
    plain = q(x)
    pre = q.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,))
    assert torch.equal(q(x), q.forward(x * 0.5))
    pre.remove()
    post = q.register_forward_hook(lambda mod, args, out: out + 1)
    assert torch.equal(q(x), plain + 1)
    post.remove()
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        q(x)
    finally:
        handle.remove()
    assert seen == ["TensorQuantizer"]
    assert torch.equal(q(x), plain)  # hooks gone: the direct call again


@needs_kernel
def test_a_forward_wrapped_on_the_instance_still_runs():
    q, x = _hot_quantizer()
    plain = q(x)
    original = q.forward
    q.forward = lambda inputs: original(inputs) * 3  # what accelerate's device hooks do
    for _ in range(2):  # the first call decides again, the second could skip the wrapper
        assert torch.equal(q(x), plain * 3)
    del q.forward
    assert torch.equal(q(x), plain)


@needs_kernel
def test_a_subclass_or_patched_forward_is_never_skipped(monkeypatch):
    class Logged(quant_nn.TensorQuantizer):
        calls = 0

        def forward(self, inputs):
            Logged.calls += 1
            return super().forward(inputs)

    x = torch.linspace(-2, 2, 16)
    q = Logged(QuantDescriptor(amax=1.0))
    for _ in range(3):
        q(x)
    assert Logged.calls == 3
    q, x = _hot_quantizer()
    seen = []
    original = quant_nn.TensorQuantizer.forward
    monkeypatch.setattr(quant_nn.TensorQuantizer, "forward",
                        lambda self, inputs: seen.append(1) or original(self, inputs))
    q(x)
    q(x)
    assert seen == [1, 1]


@needs_kernel
def test_fx_sees_the_call_of_a_decided_quantizer():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = _hot_quantizer()[0]

        def forward(self, x):
            return self.q(x) * 2

    class Tracer(fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, quant_nn.TensorQuantizer) or super().is_leaf_module(m, name)

    graph = Tracer().trace(Net())
    assert [n.target for n in graph.nodes if n.op == "call_module"] == ["q"]


@needs_kernel
def test_the_kernel_node_saves_through_hooks_and_releases():
    q, x = _hot_quantizer()
    x.requires_grad_(True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = q(x)
    assert y.grad_fn.name() == "FakeQuantBackward"
    assert len(packed) == 2  # x and amax: something was clipped
    y.sum().backward()
    assert torch.equal(x.grad, (x.detach().abs() <= 1).float())
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    inside = torch.linspace(-0.5, 0.5, 16, requires_grad=True)  # nothing clipped: saves none
    packed.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = q(inside)
    assert packed == []
    out.sum().backward()
    assert torch.equal(inside.grad, torch.ones(16))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_forward_mode_ad_is_refused_not_dropped(requires_grad):
    """No fast path (C++ node, no-grad kernel call) may drop a forward-mode tangent silently."""
    import torch.autograd.forward_ad as fwad

    q = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0))
    x = torch.linspace(-2, 2, 16)
    q(x)
    with fwad.dual_level():
        dual = fwad.make_dual(x.clone().requires_grad_(requires_grad), torch.ones(16))
        with pytest.raises(NotImplementedError, match="jvp"):
            q(dual)

"""The C++ kernels' output pool never hands out a buffer that something still reads.

Audit for the --amp bf16 non-finite-gradient report (docs/bf16-cpu-gradient.md): every way a
training step keeps an output alive without a Python reference to it (autograd-saved for a
backward, a NumPy or DLPack view, a storage object, a gradient stolen by AccumulateGrad) must
keep the pool off that buffer.
"""

from __future__ import annotations

import pytest
import torch

from trtqat.quant import _fused, _kernels

_C = _kernels._C
pytestmark = pytest.mark.skipif(_C is None, reason="the compiled CPU kernels are not built")
AMAX = torch.tensor(1.0)
SHAPE = (64, 512)  # 128 kB: pooled


def _fq(x: torch.Tensor) -> torch.Tensor:
    y, _ = _C.fake_quant_forward(x, AMAX, -127, 127)
    return y


def _churn(n: int = 4) -> list[torch.Tensor]:
    """Outputs of the pooled size written with other values (they would overwrite a reuse)."""
    return [_fq(torch.full(SHAPE, 0.5 + i)) for i in range(n)]


def test_output_saved_by_autograd_is_not_reused():
    x = torch.randn(SHAPE)
    w = torch.randn(SHAPE, requires_grad=True)
    out = _fq(x) * w  # mul saves the fake-quantized x (its only holder) for w's gradient
    _churn()
    out.sum().backward()
    torch.testing.assert_close(w.grad, _fused.fake_quant_forward(x, AMAX, -127, 127)[0],
                               rtol=0, atol=0)


@pytest.mark.parametrize("holder", ["numpy", "dlpack", "storage", "detach"])
def test_output_held_outside_a_tensor_is_not_reused(holder):
    x = torch.randn(SHAPE)
    y = _fq(x)
    expected = y.clone()
    if holder == "numpy":
        kept = y.numpy()
    elif holder == "dlpack":
        kept = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(y))
    elif holder == "storage":
        kept = y.untyped_storage()
    else:
        kept = y.detach()
    del y
    _churn()
    if holder == "storage":
        again = torch.empty(0).set_(kept, 0, SHAPE)
    else:
        again = torch.as_tensor(kept)
    assert torch.equal(again.reshape(SHAPE), expected)


def test_gradient_stolen_by_accumulate_grad_is_not_reused():
    w = torch.nn.Parameter(torch.randn(SHAPE))
    amax = torch.tensor(0.5)  # clips: the backward runs the pooled grad_input kernel
    from trtqat.quant.functional import fake_tensor_quant

    (fake_tensor_quant(w, amax) * 3.0).sum().backward()
    expected = w.grad.clone()
    assert bool((expected == 0).any()) and bool((expected == 3.0).any())
    _churn()
    grads = [_C.fake_quant_grad_input(torch.full(SHAPE, 7.0), w.detach(), amax, -127, 127)
             for _ in range(3)]
    assert all(g.data_ptr() != w.grad.data_ptr() for g in grads)
    assert torch.equal(w.grad, expected)

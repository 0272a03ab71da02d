"""A compiled QAT step keeps no more for backward than the compiled FP32 step (issue 35),
with the gradients of the compiled path that keeps the quantized copies."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import trtqat
from trtqat import quant_modules
from trtqat.quant import fake_quant_op

BACKEND = "aot_eager_decomp_partition"  # inductor's decompositions and partitioner, no codegen


@pytest.fixture(autouse=True)
def _fresh_dynamo(one_thread):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _float() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def _models(x: torch.Tensor) -> tuple[nn.Module, nn.Module]:
    fp32 = _float().train()
    with quant_modules.initialized():
        qat = _float()
    trtqat.collect_stats(qat, [x * 0.5], progress=False)  # x clips: masks are not all ones
    trtqat.compute_amax(qat, "max")
    return fp32, qat.train()


def _step(model: nn.Module, x: torch.Tensor, amp: bool, recompute: bool):
    """Saved bytes and dtypes of one compiled step; its output and gradients."""
    previous = fake_quant_op.set_recompute(recompute)
    torch._dynamo.reset()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[torch.dtype, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen.setdefault(ptr, (t.dtype, t.untyped_storage().nbytes()))
        return t

    try:
        compiled = torch.compile(model, backend=BACKEND, fullgraph=True)
        model.zero_grad(set_to_none=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            out = compiled(x)
        out.float().square().sum().backward()
    finally:
        fake_quant_op.set_recompute(previous)
    grads = [p.grad.clone() for p in model.parameters()]
    return sum(n for _, n in seen.values()), {d for d, _ in seen.values()}, out.detach(), grads


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_compiled_qat_step_saves_no_more_than_fp32_with_unchanged_gradients(amp):
    x = torch.randn(4, 3, 16, 16)
    fp32, qat = _models(x)
    ref_bytes, _, _, _ = _step(fp32, x, amp, recompute=True)
    old_bytes, old_dtypes, old_out, old_grads = _step(qat, x, amp, recompute=False)
    new_bytes, new_dtypes, new_out, new_grads = _step(qat, x, amp, recompute=True)
    # the partitioner alone keeps the quantized copies beside bool clip and ReLU masks; with
    # the quantizers recomputed in backward, less than FP32 here (it keeps no ReLU output)
    assert torch.bool in old_dtypes and old_bytes > ref_bytes
    assert torch.bool not in new_dtypes
    assert new_bytes < ref_bytes < old_bytes, (new_bytes, ref_bytes, old_bytes)
    torch.testing.assert_close(new_out, old_out, rtol=0, atol=0)
    for new, old in zip(new_grads, old_grads):  # the same formulas: bit-identical
        torch.testing.assert_close(new, old, rtol=0, atol=0)


def test_no_checkpoint_without_a_gradient():
    """Evaluation (no_grad) traces the plain operator: nothing to recompute."""
    x = torch.randn(2, 3, 8, 8)
    _, qat = _models(x)
    qat.eval()
    explain = torch._dynamo.explain(qat)
    with torch.no_grad():
        result = explain(x)
    assert result.graph_break_count == 0
    gm = result.graphs[0]
    assert not any("checkpoint" in str(n.target) for n in gm.graph.nodes)
    calls = [n for n in gm.graph.nodes if "trtqat.fake_quant" in str(n.target)]
    assert len(calls) == 2 * 4 + 1  # 3 convs and the linear (input, weight), the pool

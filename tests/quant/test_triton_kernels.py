"""The Triton GPU fake-quant kernels: equal to the PyTorch reference (interpreter on the CPU),
and chosen automatically for CUDA tensors (needs a GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from triton_cases import case_ids, run_in_interpreter  # noqa: E402

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed")


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    """Every case checked once, in one subprocess under TRITON_INTERPRET=1."""
    return run_in_interpreter(HERE / "triton_cases.py")


@needs_triton
@pytest.mark.parametrize("case", case_ids() + ["autograd-glue"])
def test_triton_kernel_equals_reference(interpreter_results, case):
    """Values, input gradient (from the packed mask) and learnable gradients, for one
    dtype x layout (per tensor / per channel on any axis, contiguous / channels_last) x format."""
    assert interpreter_results[case] == "ok", interpreter_results[case]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@needs_triton
def test_cuda_tensors_use_triton_and_keep_only_a_packed_mask():
    from trtqat.quant import _kernels
    from trtqat.quant.functional import fake_tensor_quant

    x = torch.randn(8, 16, 14, 14, device="cuda").contiguous(memory_format=torch.channels_last)
    x = x.to(torch.bfloat16).requires_grad_(True)
    y = fake_tensor_quant(x, torch.tensor(1.0, device="cuda"))
    assert _kernels.GPU_BACKEND == "triton"
    assert y.dtype == x.dtype and y.stride() == x.stride()
    assert y.grad_fn.saved_tensors[0].dtype == torch.uint8  # the mask, not the input
    assert y.grad_fn.saved_tensors[0].numel() == (x.numel() + 7) // 8
    y.float().sum().backward()
    ref = torch.fake_quantize_per_tensor_affine(x.detach().float(), 1.0 / 127, 0, -127, 127)
    torch.testing.assert_close(y.float(), ref.to(torch.bfloat16).float(), rtol=0, atol=1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@needs_triton
@pytest.mark.parametrize("backend", ["triton", "pytorch"])
def test_cuda_scale_is_the_ieee_quotient_as_on_the_cpu(backend):
    """On CUDA, torch computes ``tensor / python_number`` as a product with the number's
    rounded reciprocal; both GPU backends must divide exactly, as the CPU kernels and ONNX
    Runtime do, or every quantized value of such an amax differs in its last bit."""
    from trtqat.quant import _fused, _kernels

    cases = [(0.17511109, 127), (6.8585644, 127), (6.373247, 7), (2.7051692, 255)]
    _kernels.set_backend(backend)
    try:
        for a, qmax in cases:
            amax = torch.tensor(a)
            assert not torch.equal(amax * (1.0 / torch.tensor(float(qmax))), amax / qmax)
            x = torch.linspace(-1.5 * a, 1.5 * a, 4099)
            want = _fused.fake_quant_forward(x, amax, -qmax, qmax)[0]
            assert torch.equal(_fused.scale_of(amax.cuda(), qmax).cpu(), _fused.scale_of(amax, qmax))
            got = _kernels.fake_quant_forward(x.cuda(), amax.cuda(), -qmax, qmax)[0]
            assert torch.equal(got.cpu(), want), (a, qmax)
    finally:
        _kernels.set_backend(None)

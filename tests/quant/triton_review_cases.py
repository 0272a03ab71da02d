"""Edge cases of the Triton kernels that a GPU would hit, checked under Triton's interpreter.

Run by tests/quant/test_triton_review.py in a subprocess with ``TRITON_INTERPRET=1``; prints
one JSON object: check name -> "ok" or what went wrong.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

from trtqat.quant import _fused


def _near_2_31(tk) -> None:
    """A mask bound computed in int32 would wrap for n within 7 of 2**31: no byte read."""
    n = 2**31 - 3  # an i32 kernel argument; (n + 7) // 8 overflows int32
    grad = torch.randn(tk.BLOCK)
    mask = torch.full((tk.BLOCK // 8,), 0xFF, dtype=torch.uint8)
    out = torch.zeros(tk.BLOCK)
    # one program over the first BLOCK elements, all of them valid (offs < n)
    tk._fq_grad_from_mask[(1,)](grad, mask, out, n, tk._mask_bytes(n), WIDE=tk._wide(n),
                                BLOCK=tk.BLOCK)
    assert torch.equal(out, grad), "mask bytes were not read"


def _empty_and_scalar(tk) -> None:
    for x, amax in ((torch.empty(0, 3), torch.ones(1, 3)), (torch.empty(0), torch.tensor(1.0)),
                    (torch.tensor(0.37), torch.tensor(1.0)), (torch.randn(3, 0, 5),
                                                              torch.ones(1, 1, 1))):
        y, mask = tk.forward(x, amax, -127, 127)
        ref, _ = _fused.fake_quant_forward(x, amax, -127, 127)
        assert y.shape == ref.shape and torch.equal(y, ref), (x.shape, y, ref)
        assert mask.numel() == (x.numel() + 7) // 8
        g = torch.ones_like(x)
        assert torch.equal(tk.grad_from_mask(g, mask, x.shape, x.stride()), g)


def _amax_with_more_dims(tk) -> None:
    x = torch.randn(4, 5)
    assert tk.forward(x, torch.ones(1, 1, 1), -127, 127) is None
    from trtqat.quant.functional import fake_tensor_quant

    y = fake_tensor_quant(x, torch.ones(1, 1, 1))
    assert y.shape == (1, 4, 5), y.shape  # as broadcasting (and the CPU reference) gives


def _deterministic_learnable(tk) -> None:
    x, g = torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5)
    amax = torch.ones(1, 8, 1, 1)
    assert tk.learnable_grad(g, x, amax, -127, 127) is not None
    torch.use_deterministic_algorithms(True)
    try:
        assert tk.learnable_grad(g, x, amax, -127, 127) is None
    finally:
        torch.use_deterministic_algorithms(False)


def _launches_under_device_guard(tk) -> None:
    seen = []
    real = tk._launch_context

    def spy(device):
        seen.append(device)
        return real(device)

    tk._launch_context = spy
    try:
        x = torch.randn(3, 4)
        y, mask = tk.forward(x, torch.tensor(1.0), -127, 127)
        tk.grad_from_mask(torch.ones_like(x), mask, x.shape, x.stride())
        tk.learnable_grad(torch.ones_like(x), x, torch.tensor(1.0), -127, 127)
    finally:
        tk._launch_context = real
    assert seen == [x.device] * 3, seen


CHECKS = {"near-2**31-mask": _near_2_31, "empty-and-0d": _empty_and_scalar,
          "amax-more-dims": _amax_with_more_dims, "deterministic-learnable": _deterministic_learnable,
          "device-guard": _launches_under_device_guard}


def main() -> int:
    """Run every check; print the JSON verdicts."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    from trtqat.quant import triton_kernels as tk

    out = {}
    for name, check in CHECKS.items():
        try:
            check(tk)
            out[name] = "ok"
        except Exception:
            out[name] = traceback.format_exc()[-1500:]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

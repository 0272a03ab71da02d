"""A quantizer's CPU call against the Triton kernels, under Triton's interpreter.

Run by tests/quant/test_quantizer_fast_path.py in a subprocess with ``TRITON_INTERPRET=1``.
Prints one JSON object: case id -> "ok" or what differed.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from trtqat import nn as quant_nn
from trtqat.tensor_quant import QuantDescriptor

# name -> (dtype, axis, unsigned, num_bits)
CASES = {"f32-tensor": (torch.float32, None, False, 8), "f32-ch1-u": (torch.float32, 1, True, 8),
         "bf16-ch1-4bit": (torch.bfloat16, 1, False, 4)}


def check(dtype, axis, unsigned, bits) -> None:
    from trtqat.quant import triton_kernels

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 5, 3, generator=gen) * 2
    x = (x.abs() if unsigned else x).to(dtype)
    amax = (x.float().abs().amax() if axis is None
            else x.float().abs().amax(dim=(0, 2, 3), keepdim=True)) * 0.6
    q = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=bits, axis=(axis,) if axis else None,
                                                 unsigned=unsigned))
    q.amax = amax
    g = torch.randn(x.shape, generator=gen).to(dtype)
    leaf = x.clone().requires_grad_(True)
    y = q(leaf)
    y.backward(g)
    ref, mask = triton_kernels.forward(x, q.amax, q.minbound, q.maxbound)
    assert torch.equal(y.detach(), ref), "values differ"
    assert torch.equal(leaf.grad, triton_kernels.grad_from_mask(g, mask, x.shape, x.stride())), \
        "gradients differ"


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    results = {}
    for name, case in CASES.items():
        try:
            check(*case)
            results[name] = "ok"
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}"[:500]
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

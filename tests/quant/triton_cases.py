"""The Triton fake-quant kernels against the pure-PyTorch reference, under Triton's interpreter.

Run by tests/quant/test_triton_kernels.py in a subprocess with ``TRITON_INTERPRET=1`` (triton
reads it when it is imported, so it cannot be switched on inside a running test session).
Prints one JSON object: case id -> "ok" or what differed.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import torch

from trtqat.quant import _fused, _kernels, functional

triton_kernels = None  # imported in main(), once TRITON_INTERPRET=1 is known to be set

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# name -> (shape, axis or None, channels_last); 2288 elements span 3 programs and end mid-byte
LAYOUTS = {
    "tensor": ((3, 5, 7, 11), None, False),
    "tensor-cl": ((2, 8, 13, 11), None, True),
    "ch0-weight": ((16, 3, 3, 3), 0, False),
    "ch1-nchw": ((2, 8, 13, 11), 1, False),
    "ch1-cl": ((2, 8, 13, 11), 1, True),
    "ch2-inner": ((4, 9, 5), 2, False),
}
# (num_bits, unsigned, narrow_range)
FORMATS = [(8, False, True), (8, True, False), (4, False, False), (2, False, True),
           (16, True, False)]


def run_in_interpreter(script: Path) -> dict:
    """Run a cases script in one subprocess under TRITON_INTERPRET=1 (triton reads it when
    kernels are defined) and return the JSON it prints."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def case_ids() -> list[str]:
    return [f"{d}-{lay}-{b}{'u' if u else 's'}{'n' if n else 'f'}"
            for d, lay, (b, u, n) in itertools.product(DTYPES, LAYOUTS, FORMATS)]


def _inputs(dtype, shape, axis, cl, qmax, gen):
    x = torch.randn(shape, generator=gen) * 2
    if axis is None:
        amax = torch.tensor(1.5)
    else:
        size = [1] * len(shape)
        size[axis] = shape[axis]
        amax = torch.rand(size, generator=gen) * 2 + 0.05
    # exact ties (k + 0.5) * scale for round-half-to-even, and non-finite values
    flat = x.view(-1)
    scale = _fused.scale_of(amax.expand(shape).reshape(-1)[:8], qmax)
    flat[:8] = (torch.arange(8) - 3.5) * scale
    flat[8], flat[9], flat[10] = float("inf"), float("-inf"), float("nan")
    x = x.to(dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    g = torch.randn(shape, generator=gen).to(dtype)
    if cl:
        g = g.contiguous(memory_format=torch.channels_last)
    return x, amax, g


def check(case: str) -> None:
    dname, rest = case.split("-", 1)
    lay, fmt = rest.rsplit("-", 1)
    shape, axis, cl = LAYOUTS[lay]
    bits, unsigned, narrow = int(fmt[:-2]), fmt[-2] == "u", fmt[-1] == "n"
    qmin, qmax = functional.quant_bounds(bits, unsigned, narrow)
    x, amax, g = _inputs(DTYPES[dname], shape, axis, cl, qmax, torch.Generator().manual_seed(0))

    y, mask = triton_kernels.forward(x, amax, qmin, qmax)
    ref, _ = _fused.fake_quant_forward(x, amax, qmin, qmax)
    assert y.dtype == x.dtype and y.stride() == x.stride(), "output dtype or strides differ"
    torch.testing.assert_close(y, ref, rtol=0, atol=0, equal_nan=True)
    gi = triton_kernels.grad_from_mask(g, mask, x.shape, x.stride())
    torch.testing.assert_close(gi, _fused.fake_quant_grad_input(g, x, amax, qmin, qmax),
                               rtol=0, atol=0, equal_nan=True)
    check_codes(x, amax, qmin, qmax, y, mask)
    gx, ga = triton_kernels.learnable_grad(g, x, amax, qmin, qmax)
    rx, ra = _fused.learnable_grad(g, x, amax, qmin, qmax)
    torch.testing.assert_close(gx, rx, rtol=0, atol=0, equal_nan=True)
    assert ga.shape == ra.shape and ga.dtype == ra.dtype
    finite = torch.isfinite(ra)  # a NaN input makes its channel's sum NaN in both
    assert torch.equal(finite, torch.isfinite(ga)), "non-finite amax gradients differ"
    torch.testing.assert_close(ga[finite], ra[finite], rtol=1e-4, atol=1e-3)


def check_codes(x, amax, qmin, qmax, y, mask) -> None:
    """encode: the forward's values (in each dtype the layer may take), its mask, and integer
    codes equal to torch's formula; decode: ``(codes * s).to(dtype)``."""
    codes_dtype = next(dt for dt in (torch.int8, torch.uint8, torch.int16, torch.int32)
                       if torch.iinfo(dt).min <= qmin and qmax <= torch.iinfo(dt).max)
    scale = _fused.scale_of(amax, qmax)
    ref_codes = (x.float() / scale).round().clamp(qmin, qmax)
    known = ~torch.isnan(x)  # a NaN has no integer code (its loss is NaN anyway)
    outs = (x.dtype,) + ((torch.bfloat16, torch.float16) if x.dtype == torch.float32 else ())
    for out in outs:
        y2, mask2, codes = triton_kernels.encode(x, amax, qmin, qmax, True, codes_dtype, out)
        assert y2.dtype == out and codes.dtype == codes_dtype, "encode: wrong dtypes"
        assert y2.stride() == x.stride() and codes.stride() == x.stride(), "encode: strides"
        torch.testing.assert_close(y2, y.to(out), rtol=0, atol=0, equal_nan=True)
        assert torch.equal(mask2, mask), "encode: the mask differs from the forward's"
        assert torch.equal(codes[known], ref_codes[known].to(codes_dtype)), "codes differ"
        back = triton_kernels.decode(codes, amax, qmax, out)
        assert back.dtype == out and back.stride() == x.stride(), "decode: dtype or strides"
        assert torch.equal(back, (codes.float() * scale).to(out)), "decode differs"


def check_autograd_glue() -> None:
    """_FakeQuantFn keeps only the packed mask when the GPU path serves it (here on CPU)."""
    _kernels.fake_quant_forward_masked = lambda x, a, lo, hi: triton_kernels.forward(x, a, lo, hi)
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=torch.channels_last) * 2
    x.requires_grad_(True)
    y = functional.fake_tensor_quant(x, torch.tensor(1.0))
    assert y.grad_fn.layout is not None and y.grad_fn.saved_tensors[0].dtype == torch.uint8
    g = torch.randn(2, 4, 5, 5)  # contiguous: another layout than x
    y.backward(g)
    ref = _fused.fake_quant_grad_input(g, x.detach(), torch.tensor(1.0), -127, 127)
    torch.testing.assert_close(x.grad, ref, rtol=0, atol=0)


def main() -> None:
    global triton_kernels
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from trtqat.quant import triton_kernels

    results = {}
    for case in case_ids():
        try:
            check(case)
            results[case] = "ok"
        except Exception as exc:
            results[case] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        check_autograd_glue()
        results["autograd-glue"] = "ok"
    except Exception:
        results["autograd-glue"] = traceback.format_exc()[-800:]
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

"""The lean conv/linear path against the plain one on the CUDA kernels' strategy (Triton,
bit-packed clip mask), run on the CPU under Triton's interpreter.

Run by tests/quant/test_lean_backward.py in a subprocess with ``TRITON_INTERPRET=1``. Prints
one JSON object: case id -> "ok" or what differed.
"""

from __future__ import annotations

import itertools
import json
import os

import torch


def main() -> dict[str, str]:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from test_lean_backward import _calibrate, _net, _step

    from trtqat.quant import _kernels, triton_kernels

    # serve CPU tensors as CUDA tensors are served: the forward with a packed mask
    _kernels.fake_quant_forward_masked = (
        lambda x, amax, qmin, qmax: triton_kernels.forward(x, amax, qmin, qmax))
    _kernels.fake_quant_encode = triton_kernels.encode
    decoded = []  # the one-pass rebuild of the codes must be what backward runs
    _kernels.fake_quant_decode = (
        lambda codes, amax, qmax, dtype: decoded.append(dtype)
        or triton_kernels.decode(codes, amax, qmax, dtype))
    from trtqat.quant import lean_backward

    lean_backward.set_enabled(True)  # CPU tensors here stand for CUDA ones
    encoded = []  # the sync-free GPU encoding (codes + packed mask) must be what runs
    plain_encode = lean_backward._encode_masked
    lean_backward._encode_masked = lambda *a: encoded.append(1) or plain_encode(*a)
    results = {}
    for kind, amp, source in itertools.product(("conv", "linear"), (False, True),
                                               ("relu", "leaf")):
        case = f"{kind}-{'bf16' if amp else 'fp32'}-{source}"
        torch.manual_seed(0)
        x = torch.randn((2, 3, 9, 9) if kind == "conv" else (4, 10))
        net = _net(kind, x)
        if source == "leaf":
            x = net[1](net[0](x)).detach()
            _calibrate(net[2], x)
        try:
            plain = _step(net, x, False, amp, source == "leaf")
            lean = _step(net, x, True, amp, source == "leaf")
            bad = [i for i, (a, b) in enumerate(zip(plain, lean))
                   if a.dtype != b.dtype or not torch.equal(a, b)]
            results[case] = "ok" if not bad and len(plain) == len(lean) else f"differ: {bad}"
        except Exception as exc:  # reported, not raised: the other cases still run
            results[case] = f"{type(exc).__name__}: {exc}"
    results["gpu-encoding-used"] = "ok" if encoded else "the GPU encoding never ran"
    results["gpu-decoding-used"] = ("ok" if torch.bfloat16 in decoded and torch.float32 in decoded
                                    else f"the GPU decoding ran for {decoded}")
    return results


if __name__ == "__main__":
    print(json.dumps(main()))

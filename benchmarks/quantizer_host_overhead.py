"""Host time of one trtqat quantizer call against torch's own fake-quantize op (issue 35).

On a tiny tensor (1x8x4x4, CPU, one thread) the kernels' arithmetic is negligible: what is
measured is the per-call host cost that a GPU step pays ~109 times forward and backward in
ResNet50. Each case is a pair - a calibrated :class:`trtqat.nn.TensorQuantizer` and
``torch.fake_quantize_per_tensor_affine`` (per tensor, float scale) or
``torch.fake_quantize_per_channel_affine`` (per channel, axis 1) on the same tensor - timed
as a loop of ``--calls`` calls, the pair interleaved (order alternating) for ``--rounds``
rounds; the figures are the medians and interquartile ranges over the rounds of the time per
call, and the ratio is the median over rounds of (trtqat / torch, same round). ``fwd``: the
forward on a tensor without gradient; ``fwd+bwd``: the forward on a leaf that requires a
gradient, then ``backward``. Both kernel backends: ``default`` (the fastest: the compiled C++
kernel) and ``pytorch`` (pure-PyTorch kernels forced). Last, a quantized Conv2d
(``QuantConv2d``, as ``quant_modules.initialize()`` puts in place, calibrated) against
``nn.Conv2d`` on a 1x8x8x8 input, forward only (grad mode on, as in training): the host
time a quantized conv adds per forward (median over rounds of the difference).

    python benchmarks/quantizer_host_overhead.py [--rounds 30] [--calls 300]

Target (issue 35): every ratio <= 1.0x. The machine's load (``os.getloadavg``) is printed:
on a shared machine run it twice and trust figures whose IQR is small.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from trtqat import nn as quant_nn
from trtqat.quant import _kernels
from trtqat.tensor_quant import QuantDescriptor

TARGET = 1.0


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _pair(a: Callable[[], object], b: Callable[[], object], rounds: int, calls: int
          ) -> tuple[list[float], list[float]]:
    for _ in range(max(calls // 10, 5)):  # warm-up
        a()
        b()
    ta, tb = [], []
    for r in range(rounds):
        order = ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta))
        for fn, out in order:
            out.append(_per_call_us(fn, calls))
    return ta, tb


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def _cases(backward: bool) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    x = torch.randn(1, 8, 4, 4)
    if backward:
        x.requires_grad_(True)
    grad = torch.ones(1, 8, 4, 4)
    per_tensor = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=8))
    per_tensor.amax = x.detach().abs().amax() * 0.8  # some elements clip: masked backward
    per_channel = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=8, axis=(1,)))
    per_channel.amax = x.detach().abs().amax(dim=(0, 2, 3), keepdim=True) * 0.8
    scale = float(per_tensor.amax) / 127
    scales = (per_channel.amax.reshape(-1) / 127).contiguous()
    zero_points = torch.zeros(8, dtype=torch.int32)

    def run(f: Callable[[], torch.Tensor]) -> Callable[[], object]:
        if backward:
            return lambda: f().backward(grad)
        return f

    return {
        "per-tensor": (run(lambda: per_tensor(x)),
                       run(lambda: torch.fake_quantize_per_tensor_affine(x, scale, 0, -128, 127))),
        "per-channel": (run(lambda: per_channel(x)),
                        run(lambda: torch.fake_quantize_per_channel_affine(
                            x, scales, zero_points, 1, -128, 127))),
    }


def _conv_pair() -> tuple[Callable[[], object], Callable[[], object]]:
    torch.manual_seed(0)
    plain = nn.Conv2d(8, 8, 3, padding=1)
    quant = quant_nn.QuantConv2d(8, 8, 3, padding=1)
    quant.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(1, 8, 8, 8)
    quant.input_quantizer.amax = x.abs().amax()
    quant.weight_quantizer.amax = plain.weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)
    return (lambda: quant(x)), (lambda: plain(x))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument("--calls", type=int, default=300, help="calls per round (default 300)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    before = _kernels._forced or None
    print(f"torch {torch.__version__}, 1 thread, load {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs; {args.rounds} rounds x {args.calls} calls; "
          "us per call: median (IQR)")
    print(f"{'backend':8s} {'case':12s} {'pass':8s} {'trtqat':>16s} {'torch':>16s} {'ratio':>7s}")
    worst = 0.0
    try:
        for backend in ("default", "pytorch"):
            _kernels.set_backend(None if backend == "default" else "pytorch")
            for backward in (False, True):
                for case, (ours, theirs) in _cases(backward).items():
                    ta, tb = _pair(ours, theirs, args.rounds, args.calls)
                    ratio = statistics.median(a / b for a, b in zip(ta, tb))
                    worst = max(worst, ratio)
                    print(f"{backend:8s} {case:12s} {'fwd+bwd' if backward else 'fwd':8s} "
                          f"{statistics.median(ta):7.2f} ({_iqr(ta):5.2f}) "
                          f"{statistics.median(tb):7.2f} ({_iqr(tb):5.2f}) {ratio:6.2f}x")
            quant, plain = _conv_pair()
            tq, tp = _pair(quant, plain, args.rounds, max(args.calls // 3, 10))
            extra = statistics.median(a - b for a, b in zip(tq, tp))
            print(f"{backend:8s} QuantConv2d vs nn.Conv2d (1x8x8x8, forward, weights "
                  "require grad): "
                  f"{statistics.median(tq):.2f} vs {statistics.median(tp):.2f} us, "
                  f"+{extra:.2f} us per forward")
    finally:
        _kernels.set_backend(before)
    print(f"worst ratio {worst:.2f}x (target <= {TARGET:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

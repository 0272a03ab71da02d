"""CUDA check of the lean conv/linear backward path (``trtqat.quant.lean_backward``).

Not yet run on a GPU when written (``--device cpu`` is a smoke test of the script: C++
kernels, no peak memory).

1. Gradients of the lean path equal the plain path's (quantizer, then the layer) bit for bit
   on the real Triton kernels: conv (NCHW and channels_last) and linear, float32 and bf16
   autocast, the input kept by an in-place ReLU or not, with clipping.
2. One SGD training step of a torchvision model (default ResNet50, batch 128, 224x224, bf16
   autocast): peak memory above what is resident between steps, and the median step time,
   for FP32, trtqat on the plain path and trtqat on the lean path (repetitions interleaved).

    python benchmarks/lean_backward_cuda.py [--model resnet50] [--batch 128] [--size 224]
        [--amp bf16|none] [--steps 10] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Sequence

import torch
import torchvision
from torch import nn

import trtqat
from trtqat import nn as quant_nn
from trtqat import quant_modules
from trtqat.quant import lean_backward

DEV = ["cuda"]


def _sync() -> None:
    if DEV[0] == "cuda":
        torch.cuda.synchronize()


def _grads(net: nn.Sequential, x: torch.Tensor, lean: bool, amp: bool) -> list[torch.Tensor]:
    net.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    # the lean path on every device (the CPU included), or the plain one
    with lean_backward.using(lean), torch.autocast(DEV[0], dtype=torch.bfloat16, enabled=amp):
        y = net(x)
    assert (y.grad_fn.name() == "_LeanQuantFnBackward") == lean, y.grad_fn.name()
    (y.float() * torch.linspace(-1, 2, y.numel(), device=y.device).reshape(y.shape)).sum().backward()
    return [y, x.grad] + [p.grad for p in net.parameters() if p.grad is not None]


def check_gradients() -> int:
    """Prints one line per case; returns how many differed."""
    bad = 0
    for kind, amp, source, cl in itertools.product(("conv", "linear"), (False, True),
                                                   ("relu", "leaf"), (False, True)):
        if cl and kind == "linear":
            continue
        torch.manual_seed(0)
        if kind == "conv":
            first, layer = nn.Conv2d(3, 8, 3, padding=1), quant_nn.QuantConv2d(8, 6, 3, 2, 1)
            x = torch.randn(4, 3, 17, 17, device=DEV[0])
        else:
            first, layer = nn.Linear(10, 16), quant_nn.QuantLinear(16, 7)
            x = torch.randn(5, 3, 10, device=DEV[0])
        net = nn.Sequential(first, nn.ReLU(inplace=True)).to(DEV[0])
        if cl:
            net, x = net.to(memory_format=torch.channels_last), x.to(
                memory_format=torch.channels_last)
        with torch.no_grad():
            h = net(x)
        layer.to(DEV[0])
        layer._input_quantizer.amax = h.abs().amax() * 0.5
        w = layer.weight.detach()
        layer._weight_quantizer.amax = w.abs().amax(dim=tuple(range(1, w.dim())),
                                                    keepdim=True) * 0.7
        if source == "leaf":
            net, x = nn.Sequential(layer), h
        else:
            net = nn.Sequential(*net, layer)
        plain, lean = _grads(net, x, False, amp), _grads(net, x, True, amp)
        diff = [i for i, (a, b) in enumerate(zip(plain, lean)) if not torch.equal(a, b)]
        bad += bool(diff)
        print(f"  {kind:<6} {'bf16' if amp else 'fp32'} {source:<4} {'cl' if cl else '  '} "
              f"{'ok' if not diff else f'DIFFER {diff}'}")
    return bad


def _step(model, opt, x, target, amp):
    with torch.autocast(DEV[0], dtype=torch.bfloat16, enabled=amp):
        loss = nn.functional.cross_entropy(model(x), target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def step_memory(args: argparse.Namespace) -> None:
    """Peak memory and median time of a training step: FP32, plain trtqat, lean trtqat."""
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size, device=DEV[0])
    target = torch.randint(0, 1000, (args.batch,), device=DEV[0])
    fp32 = getattr(torchvision.models, args.model)(weights=None).to(DEV[0]).train()
    with quant_modules.initialized():
        qat = getattr(torchvision.models, args.model)(weights=None).to(DEV[0])
    qat.load_state_dict(fp32.state_dict(), strict=False)
    trtqat.collect_stats(qat, [x[:16]], progress=False)
    trtqat.compute_amax(qat, "max")
    qat.train()
    amp = args.amp == "bf16"
    variants = {"fp32": (fp32, True), "trtqat plain": (qat, False), "trtqat lean": (qat, True)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for k, (m, _) in
            variants.items()}
    peak, times = {}, {k: [] for k in variants}
    names = list(variants)
    for rep in range(args.steps + 1):
        k = rep % len(names)  # the order rotates every repetition
        for name in names[k:] + names[:k]:
            model, lean = variants[name]
            with lean_backward.using(lean):
                _sync()
                cuda = DEV[0] == "cuda"
                base = torch.cuda.memory_allocated() if cuda else 0
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                _step(model, opts[name], x, target, amp)
                _sync()
                if rep:
                    times[name].append(time.perf_counter() - t0)
                peak[name] = torch.cuda.max_memory_allocated() - base if cuda else 1
    print(f"{args.model}, batch {args.batch}, {args.size}x{args.size}, amp {args.amp}, "
          f"{torch.cuda.get_device_name() if DEV[0] == 'cuda' else 'cpu'}: one SGD step")
    for name in variants:
        ms = statistics.median(times[name]) * 1e3
        print(f"  {name:<14} step peak {peak[name] / 2**30:7.2f} GiB  "
              f"{peak[name] / peak['fp32']:6.3f}x FP32   median {ms:8.1f} ms  "
              f"{ms / (statistics.median(times['fp32']) * 1e3):6.3f}x FP32")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--amp", choices=["none", "bf16"], default="bf16")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--no-check", action="store_true", help="skip the gradient check")
    args = p.parse_args(argv)
    DEV[0] = args.device
    bad = 0
    if not args.no_check:
        print(f"gradients, lean vs plain path ({DEV[0]} kernels):")
        bad = check_gradients()
    step_memory(args)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Inductor fusion of trtqat's quantizers, shown: generated kernels of a compiled QAT training
step (forward + backward) against the FP32 one, and the compiled step-time ratio.

``torch.compile`` (inductor, CPU by default) compiles one training step of the float model
and of the same model fake-quantized by trtqat (built under ``quant_modules.initialized()``,
calibrated with ``collect_stats`` + ``compute_amax(model, 'max')``). Each quantizer reaches
inductor as plain aten ops (``torch.ops.trtqat.fake_quant`` decomposes into div / round /
clamp / mul, its backward into ge / le / mul: ``trtqat/quant/fake_quant_op.py``), so inductor
may fuse it into the neighbouring elementwise kernels (batch-norm, ReLU, residual adds).

Kernels are counted in the code inductor generates for the step (``run_and_get_code``:
forward and backward modules): every ``async_compile`` kernel definition, and separately the
calls to library kernels (``extern_kernels``: convolutions, matmuls). Printed: FP32 kernels,
QAT kernels, extra generated kernels per enabled quantizer (target ~0: fused), how many QAT
kernels round (hold a quantizer) and how many of those do nothing else, then the median
compiled step time of each, measured interleaved, and their ratio QAT/FP32.

    python benchmarks/qat_fusion.py [--model resnet18] [--batch 8] [--size 64] [--steps 10]
    python benchmarks/qat_fusion.py --model tiny --steps 2   # a quick check that it runs

Measured with the defaults (torch 2.14 CPU, one thread, a shared and busy 2-core machine):
FP32 27 generated kernels and 43 library calls, QAT 40 and 43 for 43 enabled quantizers,
i.e. 0.30 extra kernels per quantizer; 39 of the QAT kernels hold a quantizer and 3 of them
nothing else (the rest are fused with batch-norm, ReLU, residual adds and their backward).
Since quantizers are recomputed in backward (``trtqat.quant.fake_quant_op.traced``: the
step keeps less than FP32's), backward rebuilds each quantized convolution input in a kernel
of its own where it has no neighbour to fuse with; with ``TRTQAT_COMPILED_RECOMPUTE=0`` (the
quantized copies kept) QAT has 34 kernels, 0.16 per quantizer, 33 rounding, 1 alone. The
compiled QAT step took 1.10-1.17x the compiled FP32 step in two runs (1.16-1.29x with the
copies kept; median of 6-10 interleaved pairs, the machine's load varying between runs):
fusion saves launches and memory passes, not the quantizers' arithmetic.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Sequence

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # count code compiled here, now

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch import nn  # noqa: E402

import trtqat  # noqa: E402
from trtqat import quant_modules  # noqa: E402
from trtqat.quant.model_ops import quantizers  # noqa: E402

KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.\w+\(", re.M)
EXTERN_CALL = re.compile(r"\bextern_kernels\.\w+\(|\btorch\.ops\.\w+\.\w+\.\w+\(")
ROUNDING = re.compile(r"nearbyint|\bround\b|rint\(|std::round|libdevice\.(round|rint)")
KERNEL_PREFIX = re.compile(r"^(cpp|triton_[a-z]+)_fused_|_\d+$")
# the op names inductor puts in a kernel's name that a quantizer (or its backward) explains
QUANT_OPS = ("fake_quant_learnable_grad", "fake_quant_grad", "fake_quant", "clamp", "round",
             "div", "mul", "ge", "le", "logical_and", "where", "scalar_tensor", "abs")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18",
                   help="a torchvision model name, or 'tiny' (conv-BN-ReLU x2, linear)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="input height and width")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is visible to torch here; use --device cpu")
    if min(args.batch, args.size, args.steps) < 1:
        p.error("--batch, --size and --steps must be >= 1")
    return args


def _float(name: str) -> nn.Module:
    if name == "tiny":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    return getattr(torchvision.models, name)(weights=None, num_classes=10)


def build(name: str, device: str, calib: torch.Tensor) -> tuple[nn.Module, nn.Module, int]:
    """The float model, the calibrated trtqat model with the same weights, and how many
    quantizers the latter has enabled."""
    torch.manual_seed(0)
    fp32 = _float(name)
    with quant_modules.initialized():
        qat = _float(name)
    qat.load_state_dict(fp32.state_dict(), strict=False)
    fp32.to(device).train()
    qat.to(device)
    trtqat.collect_stats(qat, [calib], progress=False)
    trtqat.compute_amax(qat, "max")
    qat.train()
    return fp32, qat, sum(1 for _, q in quantizers(qat) if not q.disabled)


def count_kernels(codes: Sequence[str]) -> dict[str, int]:
    """Kernels in inductor's output ``codes``: generated ones, library calls, generated ones
    that round (hold a quantizer), and those whose name shows nothing but quantizer ops."""
    names: list[str] = []
    rounding = quant_only = 0
    for code in codes:
        defs = list(KERNEL_DEF.finditer(code))
        for i, m in enumerate(defs):
            body = code[m.start():defs[i + 1].start() if i + 1 < len(defs) else len(code)]
            names.append(m.group(1))
            if "fake_quant" in m.group(1) or ROUNDING.search(body):
                rounding += 1
                quant_only += quant_only_name(m.group(1))
    extern = sum(len(EXTERN_CALL.findall(c)) for c in codes)
    return {"generated": len(names), "extern": extern, "rounding": rounding,
            "quant_only": quant_only}


def quant_only_name(name: str) -> bool:
    """Whether a generated kernel's name shows nothing but quantizer ops (not fused with
    other work): ``cpp_fused_fake_quant_fake_quant_grad_3`` is, ``cpp_fused_..._relu_1``
    is not."""
    rest = KERNEL_PREFIX.sub("", name)
    for op in QUANT_OPS:
        rest = rest.replace(op, "")
    return bool(name) and not rest.strip("_")


def compiled_step(model: nn.Module):
    """forward + cross-entropy + backward through ``torch.compile(model)`` (inductor)."""
    fast = torch.compile(model, backend="inductor")

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(fast(x), y)
        loss.backward()
        return loss.detach()

    return step


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: Sequence[str] | None = None) -> dict:
    """Compile, count, time; print the figures and return them."""
    from torch._inductor.utils import run_and_get_code

    args = _parse(argv)
    # dynamo's note that it traces through an lru_cache (the quantizer's integer bounds)
    warnings.filterwarnings("ignore", message=".*functools.lru_cache")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=gen).to(args.device)
    y = torch.randint(0, 10, (args.batch,), generator=gen).to(args.device)
    fp32, qat, n_quant = build(args.model, args.device, x)
    steps, counts, compile_s = {}, {}, {}
    for label, model in (("fp32", fp32), ("qat", qat)):
        print(f"compiling the {label} step ...", file=sys.stderr, flush=True)
        steps[label] = compiled_step(model)
        t0 = time.perf_counter()
        _, codes = run_and_get_code(steps[label], x, y)
        compile_s[label] = time.perf_counter() - t0
        counts[label] = count_kernels(codes)
    times: dict[str, list[float]] = {"fp32": [], "qat": []}
    for rep in range(args.steps + 1):  # the first repetition warms up, untimed
        order = ("fp32", "qat") if rep % 2 == 0 else ("qat", "fp32")
        for label in order:
            _sync(args.device)
            t0 = time.perf_counter()
            steps[label](x, y)
            _sync(args.device)
            if rep:
                times[label].append(time.perf_counter() - t0)
    ratio = statistics.median(q / f for q, f in zip(times["qat"], times["fp32"]))
    extra = (counts["qat"]["generated"] - counts["fp32"]["generated"]) / max(n_quant, 1)
    result = {"model": args.model, "quantizers": n_quant, "counts": counts, "ratio": ratio,
              "extra_per_quantizer": extra, "compile_s": compile_s,
              "ms": {k: 1e3 * statistics.median(v) for k, v in times.items()}}
    _print(result, args)
    return result


def _print(r: dict, args: argparse.Namespace) -> None:
    c = r["counts"]
    print(f"inductor fusion of trtqat quantizers: {r['model']}, one training step (forward + "
          f"backward), batch {args.batch}x3x{args.size}x{args.size}, {args.device}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'':<8} {'generated':>9} {'library':>8} {'rounding':>9} {'quant-only':>10} "
          f"{'step ms':>9} {'compile s':>9}")
    for k in ("fp32", "qat"):
        print(f"{k:<8} {c[k]['generated']:9d} {c[k]['extern']:8d} {c[k]['rounding']:9d} "
              f"{c[k]['quant_only']:10d} {r['ms'][k]:9.1f} {r['compile_s'][k]:9.1f}")
    print(f"enabled quantizers: {r['quantizers']}; extra generated kernels per quantizer: "
          f"{r['extra_per_quantizer']:.2f} (target ~0: fused into neighbouring kernels)")
    print(f"compiled step time QAT / FP32 (median of interleaved pairs, {args.steps} steps): "
          f"{r['ratio']:.3f}")
    print("generated: kernels inductor wrote (forward and backward); library: calls to library "
          "kernels\n(convolutions, matmuls); rounding: generated kernels that round (hold a "
          "quantizer);\nquant-only: of those, kernels named for nothing but quantizer ops "
          "(not fused with other work).")


if __name__ == "__main__":
    main()

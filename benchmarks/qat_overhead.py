"""QAT training-step overhead on CPU: fake-quantized ResNet step time / FP32 step time.

One training step = forward, cross-entropy, backward, SGD step (batch 32, 3x64x64 inputs by
default). Variants, each with its own copy of the same weights, are timed in ONE run with
their repetitions interleaved (the order rotates every repetition) so that machine noise
hits them alike; the figures are medians, and the ratio is the median over repetitions of
(variant step / FP32 step of the same repetition).

* ``fp32``             torchvision model as is
* ``trtqat cpp``       built under ``trtqat.quant_modules.initialized()``, calibrated with
                       ``collect_stats`` + ``compute_amax(model, 'max')``; compiled kernels
* ``trtqat pytorch``   the same model with the pure-PyTorch kernels forced
                       (``trtqat.quant._kernels.set_backend('pytorch')``)
* ``modelopt``         NVIDIA Model Optimizer ``mtq.quantize(model, mtq.INT8_DEFAULT_CFG, ...)``
                       when ``modelopt`` imports

At the end it runs the histogram-calibration throughput benchmark
(``benchmarks/calib_throughput.py``) when that file is present.

    python benchmarks/qat_overhead.py [--models resnet18,resnet50] [--steps N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import io
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torchvision
from torch import nn

import trtqat
from trtqat import quant_modules
from trtqat.quant import _kernels

TARGET_RATIO = 1.05


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,resnet50",
                   help="comma-separated torchvision model names (default: resnet18,resnet50)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per variant (default 12, 4 with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps per variant first (default 3, 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer steps; a short calibration run")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=64, help="input height and width")
    p.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-modelopt", action="store_true", help="skip NVIDIA Model Optimizer")
    p.add_argument("--no-calib", action="store_true",
                   help="skip the histogram-calibration throughput benchmark")
    p.add_argument("--calib-args", default=None,
                   help="arguments for benchmarks/calib_throughput.py (default: none, "
                        "'--repeats 2 --batches 2' with --quick)")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 4 if args.quick else 12
    if args.warmup is None:
        args.warmup = 2 if args.quick else 3
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


# ----------------------------------------------------------------------------- models
def _batches(n: int, args: argparse.Namespace, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(args.batch, 3, args.size, args.size, generator=gen),
             torch.randint(0, 1000, (args.batch,), generator=gen)) for _ in range(n)]


def _float_model(name: str) -> nn.Module:
    return getattr(torchvision.models, name)(weights=None)


def _trtqat_model(name: str, state: dict, calib: list) -> nn.Module:
    with quant_modules.initialized():
        model = _float_model(name)
    model.load_state_dict(state, strict=False)
    trtqat.collect_stats(model, [x for x, _ in calib], progress=False)
    trtqat.compute_amax(model, "max")
    return model


def _modelopt_model(name: str, state: dict, calib: list) -> tuple[nn.Module | None, str]:
    """(quantized model, version) or (None, why it was not measured)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import modelopt
            import modelopt.torch.quantization as mtq
    except Exception as exc:  # not installed, or no CPU support in this version
        return None, f"modelopt not importable ({type(exc).__name__}: {exc})"
    model = _float_model(name)
    model.load_state_dict(state)

    def forward_loop(m: nn.Module) -> None:
        for x, _ in calib:
            m(x)

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)
    except Exception as exc:
        return None, f"mtq.quantize failed on CPU ({type(exc).__name__}: {exc})"
    return model, getattr(modelopt, "__version__", "?")


class Variant:
    def __init__(self, label: str, model: nn.Module, args: argparse.Namespace,
                 backend: str | None = None) -> None:
        self.label = label
        self.model = model.train()
        self.backend = backend
        self.opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        self.times: list[float] = []  # wall-clock seconds per step
        self.cpu: list[float] = []  # process CPU seconds per step (all threads)

    def prepare(self) -> None:
        if self.backend is not None:
            _kernels.set_backend(self.backend)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        c0, t0 = time.process_time(), time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(x), y).backward()
        self.opt.step()
        return time.perf_counter() - t0, time.process_time() - c0


def _measure(variants: list[Variant], data: list, steps: int, warmup: int,
             log: Callable[[str], None]) -> None:
    before = _kernels.BACKEND
    for rep in range(warmup + steps):
        x, y = data[rep % len(data)]
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:  # rotate the order every repetition
            v.prepare()
            gc.collect()
            wall, cpu = v.step(x, y)
            if rep >= warmup:
                v.times.append(wall)
                v.cpu.append(cpu)
        if rep == warmup - 1:
            log("    warm-up done")
    _kernels.set_backend(before)


def _kernel_share(v: Variant, data: list, steps: int) -> dict:
    """Time spent inside the fake-quant kernels during ``steps`` extra (untimed) steps."""
    fwd, grad = _kernels.fake_quant_forward, _kernels.fake_quant_grad_input
    acc = {"fwd": 0.0, "bwd": 0.0, "calls": 0, "clipped": 0, "masked": 0}

    def timed_fwd(x, amax, qmin, qmax):
        t0 = time.perf_counter()
        out = fwd(x, amax, qmin, qmax)
        acc["fwd"] += time.perf_counter() - t0
        acc["calls"] += 1
        acc["clipped"] += out[1] is not False
        return out

    def timed_grad(g, x, amax, qmin, qmax):
        t0 = time.perf_counter()
        out = grad(g, x, amax, qmin, qmax)
        acc["bwd"] += time.perf_counter() - t0
        acc["masked"] += 1
        return out

    v.prepare()
    _kernels.fake_quant_forward, _kernels.fake_quant_grad_input = timed_fwd, timed_grad
    try:
        for i in range(steps):
            v.step(*data[i % len(data)])
    finally:
        _kernels.fake_quant_forward, _kernels.fake_quant_grad_input = fwd, grad
    return {k: val / steps for k, val in acc.items()}


def _ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b)]


def _bench_model(name: str, args: argparse.Namespace, log: Callable[[str], None]) -> list[dict]:
    torch.manual_seed(0)
    fp32 = _float_model(name)
    state = copy.deepcopy(fp32.state_dict())
    calib = _batches(2 if args.quick else 4, args, seed=1)
    data = _batches(4, args, seed=2)
    log(f"  {name}: building and calibrating the fake-quantized model ...")
    qat = _trtqat_model(name, state, calib)
    variants = [Variant("fp32", fp32, args)]
    if "cpp" in _kernels.available_backends():
        variants.append(Variant("trtqat cpp", qat, args, backend="cpp"))
        variants.append(Variant("trtqat pytorch", copy.deepcopy(qat), args, backend="pytorch"))
    else:
        variants.append(Variant("trtqat pytorch", qat, args, backend="pytorch"))
    notes = []
    if not args.no_modelopt:
        mo, info = _modelopt_model(name, state, calib)
        if mo is None:
            notes.append(f"ModelOpt not measured: {info}")
        else:
            variants.append(Variant(f"modelopt {info}", mo, args))
    else:
        notes.append("ModelOpt not measured: --no-modelopt")
    log(f"  {name}: timing {len(variants)} variants x {args.steps} steps "
        f"(+{args.warmup} warm-up), interleaved ...")
    _measure(variants, data, args.steps, args.warmup, log)
    ref = variants[0]
    rows = []
    for v in variants:
        r = _ratios(v.times, ref.times)
        q = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0], r[0], r[0]]
        rows.append({"model": name, "variant": v.label, "ms": 1e3 * statistics.median(v.times),
                     "ratio": statistics.median(r), "q1": q[0], "q3": q[2],
                     "cpu_ms": 1e3 * statistics.median(v.cpu),
                     "cpu_ratio": statistics.median(_ratios(v.cpu, ref.cpu))})
    cpp = next((v for v in variants if v.label == "trtqat cpp"), None)
    if cpp is not None:
        k = _kernel_share(cpp, data, 2 if args.quick else 4)
        fp_ms = 1e3 * statistics.median(ref.times)
        notes.append(
            f"trtqat cpp kernels inside a step: forward {1e3 * k['fwd']:.1f} ms + backward mask "
            f"{1e3 * k['bwd']:.1f} ms = {100e3 * (k['fwd'] + k['bwd']) / fp_ms:.1f}% of the FP32 "
            f"step; {k['clipped']:.0f} of {k['calls']:.0f} quantizer calls clipped (masked "
            f"backward), the rest pass the gradient through")
    for n in notes:
        rows.append({"model": name, "note": n})
    return rows


def _print_table(rows: list[dict]) -> None:
    print()
    print(f"{'model':<10} {'variant':<22} {'wall ms':>9} {'x FP32':>7} {'IQR':>13}  "
          f"{'cpu ms':>9} {'x FP32':>7}  target (wall)")
    for r in rows:
        if "note" in r:
            print(f"{r['model']:<10} {r['note']}")
            continue
        iqr = f"{r['q1']:.3f}-{r['q3']:.3f}" if r["variant"] != "fp32" else ""
        target = ""
        if r["variant"] == "trtqat cpp" or (r["variant"] == "trtqat pytorch"
                                            and "cpp" not in _kernels.available_backends()):
            ok = "met" if r["ratio"] <= TARGET_RATIO else "MISSED"
            target = f"<= {TARGET_RATIO:.2f}: {ok}"
        print(f"{r['model']:<10} {r['variant']:<22} {r['ms']:9.1f} {r['ratio']:7.3f} {iqr:>13}  "
              f"{r['cpu_ms']:9.1f} {r['cpu_ratio']:7.3f}  {target}")
    print("x FP32: median over repetitions of (variant step / FP32 step of the same repetition);"
          "\nIQR: its interquartile range; cpu: process CPU time (all threads), less sensitive to"
          "\nother processes on a shared machine than wall-clock time.")


def _run_calib_benchmark(args: argparse.Namespace) -> None:
    path = Path(__file__).with_name("calib_throughput.py")
    print()
    if not path.exists():
        print(f"histogram-calibration throughput: not run ({path.name} is absent)")
        return
    extra = args.calib_args
    if extra is None:
        extra = "--repeats 2 --batches 2" if args.quick else ""
    argv = shlex.split(extra)
    if args.threads is not None and "--threads" not in argv:
        argv += ["--threads", str(args.threads)]
    print(f"histogram-calibration throughput ({' '.join([path.name, *argv])}):")
    sys.stdout.flush()
    try:
        spec = importlib.util.spec_from_file_location("_trtqat_calib_throughput", path)
        module = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(module)
        try:
            module.main(argv)
        except SystemExit as exc:  # its parser refused the arguments: run with its defaults
            if not argv or exc.code in (0, None):
                raise
            print("  (arguments refused; running with its defaults)")
            module.main([])
    except Exception as exc:
        print(f"  failed: {type(exc).__name__}: {exc}")


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = _parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    print(f"QAT training-step overhead on CPU: batch {args.batch}x3x{args.size}x{args.size}, "
          f"SGD lr={args.lr} momentum 0.9, {args.steps} steps per variant (median)")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}; trtqat kernels: "
          f"{_kernels.BACKEND}"
          + (f" (extension: {_kernels.EXTENSION_ERROR})" if _kernels.EXTENSION_ERROR else ""))
    if os.environ.get("TRTQAT_KERNELS"):
        print(f"note: TRTQAT_KERNELS={os.environ['TRTQAT_KERNELS']} is set")
    rows: list[dict] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        rows += _bench_model(name, args, log)
        gc.collect()
    _print_table(rows)
    print(f"target: trtqat training step <= {TARGET_RATIO:.2f}x the FP32 step")
    if not args.no_calib:
        _run_calib_benchmark(args)
    return rows


if __name__ == "__main__":
    main()

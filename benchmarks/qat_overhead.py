"""QAT training-step overhead: fake-quantized ResNet step time / FP32 step time, CPU or CUDA.

One training step = forward, cross-entropy, backward, SGD step. CPU defaults: batch 32,
3x64x64 inputs; CUDA defaults (``--device cuda``): batch 128, 3x224x224. Variants, each with
its own copy of the same weights, are timed in ONE run with their repetitions interleaved (the
order rotates every repetition) so that machine noise hits them alike; the figures are
medians, and the ratio is the median over repetitions of (variant step / FP32 step of the same
repetition). ``--amp bf16|fp16`` (autocast; a gradient scaler for fp16) and ``--compile``
(``torch.compile`` of every variant, FP32 included) apply to all variants alike.

* ``fp32``               torchvision model as is
* ``trtqat cpp|triton``  built under ``trtqat.quant_modules.initialized()``, calibrated with
                         ``collect_stats`` + ``compute_amax(model, 'max')``; fast kernels
                         (compiled C++ on CPU, Triton on CUDA)
* ``trtqat pytorch``     the same model with the pure-PyTorch kernels forced
                         (``trtqat.quant._kernels.set_backend('pytorch')``; not with --compile)
* ``torch fake_quantize_*`` the same calibrated model with torch's own fake-quant ops in place
                         of every quantizer (``benchmarks/qat_peers.py``)
* ``pytorch-quantization`` / ``modelopt``  NVIDIA's libraries, when they import

On CUDA each variant's peak memory above what is resident between steps (activations kept
for backward, gradients, temporaries) is measured too (``torch.cuda.max_memory_allocated``),
and its GPU busy time per step (the profiler's summed kernel time over a few extra steps,
``benchmarks/qat_step_cuda.py``) beside the wall and process CPU time: a step whose GPU busy
time is far below its wall time, with CPU time close to it, is host-bound (column ``bound``).
On CUDA the table also has ``trtqat graphs``: the trtqat model with its whole step captured
as one CUDA graph (``trtqat train/qat --cuda-graphs``; fused SGD; not with --compile or
fp16; ``--no-cuda-graphs`` leaves it out).

``--repeat-process N`` runs the whole comparison N times in fresh processes and reports the
median of the per-process medians and whether the ordering of the variants held in each
(``benchmarks/qat_overhead_repeat.py``).

ModelOpt (``nvidia-modelopt``) is measured when it imports (``--no-modelopt`` skips it). To
install it on a machine without network: on one with network, ``pip download
"nvidia-modelopt[torch]" -d wheels`` (same Python version and platform), copy ``wheels/``
over, then ``pip install --no-index --find-links wheels "nvidia-modelopt[torch]"``.

    python benchmarks/qat_overhead.py [--models resnet18,resnet50] [--steps N] [--quick]
    python benchmarks/qat_overhead.py --device cuda [--amp bf16] [--compile]
    python benchmarks/qat_overhead.py --device cuda --models resnet18 --repeat-process 3
    python benchmarks/qat_overhead.py --models resnet18 --batch 2 --size 32 --steps 2 \
        --warmup 1 --no-peers --no-calib            # a quick check that it runs
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torchvision
from torch import nn

import trtqat
from trtqat import quant_modules
from trtqat.quant import _kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qat_peers  # noqa: E402  (a sibling file of this script)
from qat_step_timing import Variant, gpu_busy, kernel_share, kernel_threads, measure, ratios  # noqa: E402

TARGET_RATIO = 1.05  # CPU, eager
CUDA_TARGETS = {"eager": 1.10, "compiled": 1.05, "memory": 1.2}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,resnet50",
                   help="comma-separated torchvision model names (default: resnet18,resnet50)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per variant (default 12, 4 with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps per variant first (default 3, 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer steps; a short calibration run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                   help="autocast dtype for forward and loss (fp16 adds a gradient scaler)")
    p.add_argument("--compile", action="store_true", help="torch.compile every variant")
    p.add_argument("--batch", type=int, default=None, help="default 32 on CPU, 128 on CUDA")
    p.add_argument("--size", type=int, default=None,
                   help="input height and width (default 64 on CPU, 224 on CUDA)")
    p.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-modelopt", action="store_true", help="skip NVIDIA Model Optimizer")
    p.add_argument("--no-peers", action="store_true",
                   help="time only FP32 and trtqat (no torch ops, pytorch-quantization, ModelOpt)")
    p.add_argument("--no-calib", action="store_true",
                   help="skip the histogram-calibration throughput benchmark")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="CUDA: leave out the trtqat variant replayed as one CUDA graph")
    p.add_argument("--repeat-process", type=int, default=None, metavar="N",
                   help="run the whole comparison N times in fresh processes; report the "
                        "median of medians and whether the ordering held in each")
    p.add_argument("--json-out", default=None, metavar="FILE",
                   help="also write the table rows as JSON (what --repeat-process reads)")
    p.add_argument("--calib-args", default=None,
                   help="arguments for benchmarks/calib_throughput.py (default: none, "
                        "'--repeats 2 --batches 2' with --quick)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is visible to torch here (torch.cuda.is_available() "
                f"is False; torch {torch.__version__}); run on a GPU machine or use --device cpu")
    if args.amp == "fp16" and not cuda:
        p.error("--amp fp16 needs --device cuda; on the CPU use --amp bf16 or none")
    if args.batch is None:
        args.batch = 128 if cuda else 32
    if args.size is None:
        args.size = 224 if cuda else 64
    if args.steps is None:
        args.steps = 4 if args.quick else (20 if cuda else 12)
    if args.warmup is None:
        args.warmup = 2 if args.quick else (5 if cuda else 3)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.repeat_process is not None and args.repeat_process < 1:
        p.error("--repeat-process must be >= 1")
    return args


# ----------------------------------------------------------------------------- models
def _batches(n: int, args: argparse.Namespace, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(args.batch, 3, args.size, args.size, generator=gen).to(args.device),
             torch.randint(0, 1000, (args.batch,), generator=gen).to(args.device))
            for _ in range(n)]


def _float_model(name: str) -> nn.Module:
    return getattr(torchvision.models, name)(weights=None)


def _trtqat_model(name: str, state: dict, calib: list, device: str) -> nn.Module:
    with quant_modules.initialized():
        model = _float_model(name)
    model.load_state_dict(state, strict=False)
    model.to(device)
    trtqat.collect_stats(model, [x for x, _ in calib], progress=False)
    trtqat.compute_amax(model, "max")
    return model


def _variants(name: str, fp32: nn.Module, state: dict, calib: list, args: argparse.Namespace,
              notes: list[str]) -> list[Variant]:
    qat = _trtqat_model(name, state, calib, args.device)
    variants = [Variant("fp32", fp32, args)]
    fast = "triton" if args.device == "cuda" else "cpp"
    try:
        _kernels.set_backend(fast)
        has_fast = True
    except RuntimeError:
        has_fast = False
    _kernels.set_backend(None)
    if has_fast:
        variants.append(Variant(f"trtqat {fast}", qat, args, backend=fast))
        if not args.compile:  # compiled graphs decompose the quantizers: no kernel to choose
            variants.append(Variant("trtqat pytorch", copy.deepcopy(qat), args,
                                    backend="pytorch"))
    else:
        variants.append(Variant("trtqat pytorch", qat, args, backend="pytorch"))
        notes.append(f"trtqat {fast} kernels unavailable: {_kernels.kernel_report()}")
    _add_graphed(variants, qat, args, notes, fast if has_fast else "pytorch")
    if args.no_peers:
        notes.append("peers not measured: --no-peers")
        return variants
    native, label = qat_peers.native_model(qat)
    variants.append(Variant(label, native, args))

    def factory() -> nn.Module:
        return _float_model(name)

    peers = [("pytorch-quantization", qat_peers.pytorch_quantization_model)]
    if args.no_modelopt:
        notes.append("ModelOpt not measured: --no-modelopt")
    else:
        peers.append(("ModelOpt", qat_peers.modelopt_model))
    for title, build in peers:
        model, info = build(factory, state, calib, torch.device(args.device))
        if model is None:
            notes.append(f"{title} not measured: {info}")
        else:
            variants.append(Variant(info, model, args))
    return variants


def _add_graphed(variants: list, qat: nn.Module, args: argparse.Namespace,
                 notes: list[str], backend: str) -> None:
    """CUDA: the trtqat model with its whole step as one CUDA graph (qat_step_cuda.py)."""
    if args.device != "cuda" or args.no_cuda_graphs:
        return
    why = ("--compile" if args.compile else "--amp fp16 (its gradient scaler)"
           if args.amp == "fp16" else None)
    if why:
        notes.append(f"trtqat graphs not measured: CUDA graphs do not combine with {why}")
        return
    from qat_step_cuda import GraphedVariant

    variants.append(GraphedVariant("trtqat graphs", copy.deepcopy(qat), args.lr,
                                   amp=None if args.amp == "none" else args.amp,
                                   backend=backend))
    notes.append(f"trtqat graphs: the trtqat {backend} model, forward + backward + fused SGD "
                 "captured once and replayed (the others: foreach SGD)")


def _row(name: str, v: Variant, ref: Variant) -> dict:
    r = ratios(v.times, ref.times)
    q = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0], r[0], r[0]]
    row = {"model": name, "variant": v.label, "ms": 1e3 * statistics.median(v.times),
           "ratio": statistics.median(r), "q1": q[0], "q3": q[2],
           "cpu_ms": 1e3 * statistics.median(v.cpu),
           "cpu_ratio": statistics.median(ratios(v.cpu, ref.cpu))}
    if v.peak and ref.peak:
        row["peak_mib"] = max(v.peak) / 2**20
        row["mem_ratio"] = max(v.peak) / max(max(ref.peak), 1)
    if getattr(v, "busy_ms", None) is not None:
        from qat_step_cuda import bound

        row["gpu_ms"] = v.busy_ms
        row["bound"] = bound(row["ms"], row["cpu_ms"], v.busy_ms)
    return row


def _bench_model(name: str, args: argparse.Namespace, log: Callable[[str], None]) -> list[dict]:
    torch.manual_seed(0)
    fp32 = _float_model(name)
    state = copy.deepcopy(fp32.state_dict())
    calib = _batches(2 if args.quick else 4, args, seed=1)
    data = _batches(4, args, seed=2)
    log(f"  {name}: building and calibrating the fake-quantized models ...")
    notes: list[str] = []
    variants = _variants(name, fp32, state, calib, args, notes)
    log(f"  {name}: timing {len(variants)} variants x {args.steps} steps "
        f"(+{args.warmup} warm-up), interleaved ...")
    measure(variants, data, args.steps, args.warmup, log)
    if args.device == "cuda":
        log(f"  {name}: profiling the GPU busy time of each variant ...")
        gpu_busy(variants, data, 2 if args.quick else 4)
    ref = variants[0]
    rows = [_row(name, v, ref) for v in variants if v.error is None and v.times]
    notes += [f"{v.label} failed: {v.error}" for v in variants if v.error is not None]
    cpp = next((v for v in variants if v.label == "trtqat cpp"), None)
    if cpp is not None and not args.compile:
        k = kernel_share(cpp, data, 2 if args.quick else 4)
        fp_ms = 1e3 * statistics.median(ref.times)
        notes.append(
            f"trtqat cpp kernels inside a step: forward {1e3 * k['fwd']:.1f} ms + backward mask "
            f"{1e3 * k['bwd']:.1f} ms = {100e3 * (k['fwd'] + k['bwd']) / fp_ms:.1f}% of the FP32 "
            f"step; {k['clipped']:.0f} of {k['calls']:.0f} quantizer calls clipped (masked "
            f"backward), the rest pass the gradient through")
    for n in notes:
        rows.append({"model": name, "note": n})
    return rows


def _target(r: dict, args: argparse.Namespace) -> str:
    if args.device == "cuda":
        if r["variant"] != "trtqat triton":
            return ""
        limit = CUDA_TARGETS["compiled" if args.compile else "eager"]
        mem = CUDA_TARGETS["memory"]
        return (f"<= {limit:.2f}: {'met' if r['ratio'] <= limit else 'MISSED'}; memory <= "
                f"{mem:.1f}: {'met' if r.get('mem_ratio', 99) <= mem else 'MISSED'}")
    if r["variant"] == "trtqat cpp" or (r["variant"] == "trtqat pytorch"
                                        and "cpp" not in _kernels.available_backends()):
        return f"<= {TARGET_RATIO:.2f}: {'met' if r['ratio'] <= TARGET_RATIO else 'MISSED'}"
    return ""


def _print_table(rows: list[dict], args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    mem_head = f"{'step MiB':>9} {'x FP32':>7}  {'gpu ms':>8} {'bound':>6}  " if cuda else ""
    print()
    print(f"{'model':<10} {'variant':<30} {'wall ms':>9} {'x FP32':>7} {'IQR':>13}  "
          f"{'cpu ms':>9} {'x FP32':>7}  {mem_head}target (wall)")
    for r in rows:
        if "note" in r:
            print(f"{r['model']:<10} {r['note']}")
            continue
        iqr = f"{r['q1']:.3f}-{r['q3']:.3f}" if r["variant"] != "fp32" else ""
        gpu = f"{r['gpu_ms']:8.1f}" if "gpu_ms" in r else f"{'-':>8}"
        mem = (f"{r.get('peak_mib', 0):9.0f} {r.get('mem_ratio', 0):7.3f}  {gpu} "
               f"{r.get('bound', '?'):>6}  " if cuda else "")
        print(f"{r['model']:<10} {r['variant']:<30} {r['ms']:9.1f} {r['ratio']:7.3f} {iqr:>13}  "
              f"{r['cpu_ms']:9.1f} {r['cpu_ratio']:7.3f}  {mem}{_target(r, args)}")
    print("x FP32: median over repetitions of (variant step / FP32 step of the same repetition);"
          "\nIQR: its interquartile range; cpu: process CPU time (all threads), less sensitive to"
          "\nother processes on a shared machine than wall-clock time.")
    if cuda:
        print("step MiB: largest CUDA memory allocated during a step above what was resident "
              "before it\n(weights, optimizer state); x FP32: over FP32's under the same options."
              "\ngpu ms: the GPU's busy time per step (summed kernel and copy time, profiled); "
              "bound: host when\nthe GPU is busy < 50% of the wall time (the host launches "
              "too slowly), device when >= 80%.")


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

    if args.repeat_process is not None:
        import qat_overhead_repeat

        summary = qat_overhead_repeat.main(list(sys.argv[1:] if argv is None else argv),
                                           args.repeat_process, args.device == "cuda", log)
        if not args.no_calib:
            _run_calib_benchmark(args)
        return summary["rows"]

    where = "CUDA" if args.device == "cuda" else "CPU"
    print(f"QAT training-step overhead on {where}: batch {args.batch}x3x{args.size}x{args.size}, "
          f"SGD lr={args.lr} momentum 0.9, {args.steps} steps per variant (median); amp "
          f"{args.amp}, {'torch.compile' if args.compile else 'eager'}")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}; trtqat kernels: "
          f"{_kernels.BACKEND}{kernel_threads()}"
          + (f" (extension: {_kernels.EXTENSION_ERROR})" if _kernels.EXTENSION_ERROR else ""))
    if args.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}")
    if os.environ.get("TRTQAT_KERNELS"):
        print(f"note: TRTQAT_KERNELS={os.environ['TRTQAT_KERNELS']} is set")
    rows: list[dict] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        rows += _bench_model(name, args, log)
        gc.collect()
    _print_table(rows, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    if args.device == "cuda":
        print(f"targets (H100-class, ResNet50, bf16): eager <= {CUDA_TARGETS['eager']:.2f}x, "
              f"compiled <= {CUDA_TARGETS['compiled']:.2f}x the FP32 step under the same options;"
              f" step memory <= {CUDA_TARGETS['memory']:.1f}x FP32's")
    else:
        print(f"target: trtqat training step <= {TARGET_RATIO:.2f}x the FP32 step")
    if not args.no_calib:
        _run_calib_benchmark(args)
    return rows


if __name__ == "__main__":
    main()

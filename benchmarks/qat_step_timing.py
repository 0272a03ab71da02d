"""The timing core of ``benchmarks/qat_overhead.py``: a variant (model, optimizer, one
training step), interleaved repetitions of several variants, the time a step spends inside
trtqat's fake-quant kernels, and (CUDA) each variant's GPU busy time."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from trtqat.quant import _kernels


class Variant:
    """One row of the table: its model and optimizer, and the times of its steps."""

    def __init__(self, label: str, model: nn.Module, args: argparse.Namespace,
                 backend: str | None = None) -> None:
        self.label = label
        self.model = model.to(args.device).train()
        self.backend = backend
        self.cuda = args.device == "cuda"
        self.opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        self.run = torch.compile(self.model) if args.compile else self.model
        self.amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
        self.scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None
        self.times: list[float] = []  # wall-clock seconds per step
        self.cpu: list[float] = []  # process CPU seconds per step (all threads)
        self.peak: list[int] = []  # CUDA bytes allocated during the step above the resident
        self.error: str | None = None

    def prepare(self) -> None:
        if self.backend is not None:
            _kernels.set_backend(self.backend)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        self.opt.zero_grad(set_to_none=True)
        if self.cuda:
            torch.cuda.synchronize()
            resident = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        c0, t0 = time.process_time(), time.perf_counter()
        with torch.autocast(x.device.type, dtype=self.amp or torch.bfloat16,
                            enabled=self.amp is not None):
            loss = self.loss(self.run(x), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        if self.cuda:
            torch.cuda.synchronize()  # the step is done when the GPU is done
            self.peak.append(torch.cuda.max_memory_allocated() - resident)
        return time.perf_counter() - t0, time.process_time() - c0


def measure(variants: list[Variant], data: list, steps: int, warmup: int,
             log: Callable[[str], None]) -> None:
    """Interleaved repetitions; a variant whose step fails is recorded and dropped."""
    before = _kernels._forced or None
    for rep in range(warmup + steps):
        x, y = data[rep % len(data)]
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:  # rotate the order every repetition
            if v.error is not None:
                continue
            v.prepare()
            gc.collect()
            try:
                wall, cpu = v.step(x, y)
            except Exception as exc:  # e.g. a peer library without this dtype or device
                v.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                log(f"    {v.label} failed: {v.error}")
                continue
            if rep >= warmup:
                v.times.append(wall)
                v.cpu.append(cpu)
        if rep == warmup - 1:
            log("    warm-up done")
    _kernels.set_backend(before)


def kernel_share(v: Variant, data: list, steps: int) -> dict:
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
    hot = _kernels.hot_kernel  # the one-call C++ path bypasses the functions timed here
    _kernels.fake_quant_forward, _kernels.fake_quant_grad_input = timed_fwd, timed_grad
    _kernels.hot_kernel = lambda: None
    _kernels._names()  # quantizers decide their path again
    try:
        for i in range(steps):
            v.step(*data[i % len(data)])
    finally:
        _kernels.fake_quant_forward, _kernels.fake_quant_grad_input = fwd, grad
        _kernels.hot_kernel = hot
        _kernels._names()
    return {k: val / steps for k, val in acc.items()}


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b)]


def gpu_busy(variants: list, data: list, steps: int) -> None:
    """Each variant's GPU busy time per step, profiled over ``steps`` extra steps."""
    from qat_step_cuda import gpu_busy_ms

    for v in variants:
        if v.error is None and v.times:
            v.prepare()
            try:
                v.busy_ms = gpu_busy_ms(v.step, data, steps)
            except Exception as exc:  # the profiler unavailable: the column stays empty
                v.busy_ms = None
                print(f"    {v.label}: no GPU busy time ({type(exc).__name__}: {exc})",
                      file=sys.stderr)


def kernel_threads() -> str:
    """`` on N threads`` the compiled CPU kernels spread their loops over (a build without
    OpenMP runs them on one, whatever torch.set_num_threads says)."""
    c = _kernels._C
    if c is None or not hasattr(c, "parallel_threads"):
        return ""
    return f" on {c.parallel_threads(64)} thread(s)"

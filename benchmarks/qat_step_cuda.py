"""CUDA pieces of ``benchmarks/qat_overhead.py``: the GPU's busy time per step, and the
trtqat variant whose whole step is one CUDA graph (``--cuda-graphs``).

* :func:`gpu_busy_ms`: the summed time of the kernels (and copies) one step runs on the GPU,
  from ``torch.profiler`` over a few extra, untimed steps. A step whose GPU busy time is far
  below its wall time while its process CPU time is close to it is host-bound: the GPU waits
  for the host to launch the next kernel, which is what a CUDA graph removes.
* :class:`GraphedVariant`: a variant of the table (same interface as ``qat_step_timing.Variant``)
  stepping through :class:`trtqat.runs.graphed_step.GraphedStep`, with the optimizer
  ``trtqat train --cuda-graphs`` uses (fused SGD, the learning rate a tensor on the GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from trtqat.runs.graphed_step import GraphedStep


def bound(wall_ms: float, cpu_ms: float, busy_ms: float | None) -> str:
    """``host`` when the GPU idles most of the step (busy < 50% of wall), ``device`` when it
    is busy >= 80% of it, ``mixed`` between; ``?`` without a GPU figure."""
    if busy_ms is None or wall_ms <= 0:
        return "?"
    share = busy_ms / wall_ms
    return "host" if share < 0.5 else ("device" if share >= 0.8 else "mixed")


def gpu_busy_ms(step: Callable[[torch.Tensor, torch.Tensor], object], data: list,
                steps: int) -> float | None:
    """Milliseconds of GPU work (kernels, copies, summed) per call of ``step``, profiled over
    ``steps`` calls; None if the profiler sees no device activity."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(*data[i % len(data)])
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    total_us = 0.0  # as the profiler's own "Self CUDA time total": each device event once
    for evt in prof.events():
        if evt.device_type == cuda and not getattr(evt, "is_user_annotation", False):
            total_us += evt.self_device_time_total
    return total_us / 1e3 / max(steps, 1) if total_us > 0 else None


class GraphedVariant:
    """A trtqat model whose training step (forward, loss, backward, SGD step) is captured
    once and replayed (module doc); ``amp`` is None or ``"bf16"`` (fp16's scaler checks
    every step on the host and cannot be captured)."""

    def __init__(self, label: str, model: nn.Module, lr: float, amp: str | None = None,
                 warmup: int = 1, backend: str | None = None) -> None:
        from trtqat.runs.recipes import build_optimizer

        self.label = label
        self.backend = backend
        self.model = model.cuda().train()
        self.opt = build_optimizer("sgd", self.model, lr, 0.9, 0.0, graphs=True)
        self.graphed = GraphedStep(self.model, nn.CrossEntropyLoss(), self.opt, "cuda",
                                   amp=amp, warmup=warmup)
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.peak: list[int] = []
        self.busy_ms: float | None = None
        self.error: str | None = None

    def prepare(self) -> None:
        """The fake-quant kernels to capture (later replays run the captured ones)."""
        if self.backend is not None:
            from trtqat.quant import _kernels

            _kernels.set_backend(self.backend)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """One replayed step (the first ones eager, then the capture): wall and CPU seconds."""
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        c0, t0 = time.process_time(), time.perf_counter()
        if self.graphed(x, y) is None:
            raise RuntimeError(f"batch shape {tuple(x.shape)} is not the captured one")
        torch.cuda.synchronize()
        self.peak.append(torch.cuda.max_memory_allocated() - resident)
        if self.graphed.failed:
            raise RuntimeError(f"capture failed: {self.graphed.failed}")
        return time.perf_counter() - t0, time.process_time() - c0

"""The PyTorch QAT step of each format beside FP32's: FP8 E4M3 fake quantization against INT8.

One process, one model per format (torchvision ``--model``, random weights, ``trtqat.quantize``
with the format and max calibration on two random batches), each trained with SGD on the same
random batch; the steps are timed interleaved (``--rounds`` rounds, the order rotated each
round) after ``--warmup`` steps each, on ``--device`` (cpu or cuda, with CUDA synchronised
around every step). Prints each format's median step, its ratio to FP32's and that ratio's
spread over the rounds (interquartile range).

    python benchmarks/format_qat_step.py --model resnet18 --batch 32 --size 64
    python benchmarks/format_qat_step.py --device cuda --model resnet50 --batch 128 --size 224
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trtqat  # noqa: E402


def step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sync: bool):
    """One SGD training step of ``model`` (a closure the timer calls)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        if sync:
            torch.cuda.synchronize()
    return step


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; prints the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--formats", default="int8,fp8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    x = torch.randn(a.batch, 3, a.size, a.size, device=dev)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    calib = [torch.randn(a.batch, 3, a.size, a.size, device=dev) for _ in range(2)]
    steps = {}
    for name in ("fp32", *a.formats.split(",")):
        model = torchvision.models.__dict__[a.model](num_classes=10).to(dev)
        if name != "fp32":
            trtqat.quantize(model.eval(), {"format": name, "method": "max"}, forward_loop=calib)
        steps[name] = step_fn(model.train(), x, y, dev.type == "cuda")
    for step in steps.values():
        for _ in range(a.warmup):
            step()
    times: dict[str, list[float]] = {n: [] for n in steps}
    names = list(steps)
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            steps[name]()
            times[name].append((time.perf_counter() - t) * 1e3)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"{a.model} batch {a.batch} {a.size}px, {device}, {torch.get_num_threads()} thread(s), "
          f"{a.rounds} interleaved rounds")
    fp32 = times["fp32"]
    for name, ts in times.items():
        ratios = sorted(t / f for t, f in zip(ts, fp32))
        q = statistics.quantiles(ratios, n=4)
        print(f"  {name:<6} {statistics.median(ts):9.2f} ms   /FP32 "
              f"{statistics.median(ts) / statistics.median(fp32):5.3f}x "
              f"(per round IQR {q[0]:.3f}-{q[2]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

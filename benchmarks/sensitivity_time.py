"""Time the layer sensitivity sweep: full forward passes vs the cached fx path.

ResNet50 on the digits validation split (360 images, 32x32), randomly initialised and
calibrated (max) on a few training batches; accuracy is meaningless here, the time is the
point. Prints plain vs cached seconds side by side, their ratio, and checks that both paths
give the same per-layer numbers.

    OMP_NUM_THREADS=1 python benchmarks/sensitivity_time.py --threads 1 [--mode one-on]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=None, help="default: the whole split")
    ap.add_argument("--mode", choices=["one-on", "one-off"], default="one-on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-plain", action="store_true", help="time the cached path only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from itertools import islice

    from trtqat.families.cnn.data import make_loaders
    from trtqat.families.cnn.models import build_model
    from trtqat.quant import QuantDescriptor, collect_stats, compute_amax
    from trtqat.stages.sensitivity_sweep import CachedRunner, PlainRunner, layer_units, run_sweep

    torch.manual_seed(0)
    train, val, classes = make_loaders("digits", args.image_size, args.batch_size)
    model = build_model(args.model, classes, quantized=True,
                        quant_desc_input=QuantDescriptor(num_bits=8)).eval()
    collect_stats(model, train, num_batches=2, progress=False)
    compute_amax(model, "max")
    batches = list(islice(val, args.batches))
    units = layer_units(model)
    images = sum(len(y) for _, y in batches)
    print(f"{args.model} {args.image_size}px, {len(units)} layers, {images} images in "
          f"{len(batches)} batches, mode {args.mode}, {args.threads} thread(s)")

    t0 = time.perf_counter()
    cached = CachedRunner(model, units)
    _, fast = run_sweep(cached, units, args.mode, batches, progress=False)
    t_cached = time.perf_counter() - t0
    print(f"cached (fx, downstream only): {t_cached:8.1f} s")
    if args.skip_plain:
        return
    t0 = time.perf_counter()
    _, slow = run_sweep(PlainRunner(model, units), units, args.mode, batches, progress=False)
    t_plain = time.perf_counter() - t0
    worst = max(abs(fast[k]["output_mse"] - slow[k]["output_mse"])
                / max(abs(slow[k]["output_mse"]), 1e-12) for k in units)
    same_top1 = all(fast[k]["top1"] == slow[k]["top1"] for k in units)
    print(f"plain (full forward passes): {t_plain:8.1f} s")
    print(f"speed-up: {t_plain / t_cached:.2f}x; same top-1 per layer: {same_top1}; "
          f"largest relative output-MSE difference: {worst:.2e}")


if __name__ == "__main__":
    main()

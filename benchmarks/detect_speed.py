"""INT8 vs FP32 ONNX Runtime CPU engines of the built-in detector (``yolo_digits``).

The detector (a checkpoint's, or random weights PTQ-calibrated on the digits canvases:
speed does not depend on the weights) is exported as FP32 and as INT8 Q/DQ with the
detection family's placement (``family.quantize``, the prediction convs in float), each
built into an ORT engine (INT8 with the integer re-encoding ``ort_prepare="qdq"``,
calibrated on digits canvases), then timed interleaved: each round runs every engine once,
the order rotated, after a warm-up. Medians and spreads ((max - min) / median over rounds,
in blocks) per batch size, the INT8/FP32 speedup and the integer/float compute nodes of
each engine are printed; results go to ``--out/results.json``.

    python benchmarks/detect_speed.py                       # batch 1 and 8, 96x96
    python benchmarks/detect_speed.py --checkpoint runs/demo/qat/best.pt --rounds 200
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench

from _bench import choose_threads, interleaved, save_results  # noqa: E402

from trtqat import families  # noqa: E402
from trtqat.engines import build_engine  # noqa: E402
from trtqat.engines.ort_qdq import count_compute_nodes  # noqa: E402
from trtqat.export import export_onnx  # noqa: E402
from trtqat.export.onnx_export import image_plan  # noqa: E402
from trtqat.quant.model_ops import collect_stats, compute_amax  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="a detect ptq/qat checkpoint (default: "
                   "random weights, calibrated here)")
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--rounds", type=int, default=120)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="ORT threads (default: 2 idle, "
                   "1 busy)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def models(args: argparse.Namespace):
    """``(float model, quantized model)`` of the built-in detector."""
    from trtqat.families.detect.data import datasets, loader

    family = families.get("detect")
    if args.checkpoint:
        from trtqat.runs.checkpoint import load_checkpoint

        ckpt = load_checkpoint(args.checkpoint)
        return (family.load(ckpt, quantized=False).eval(), family.load(ckpt).eval(),
                family)
    torch.manual_seed(0)
    fp32 = family.build("yolo_digits", 10).eval()
    q = family.quantize(copy.deepcopy(fp32))
    train, _, _ = datasets("digits", args.image_size)
    collect_stats(q, loader(train, 32, True), 4, progress=False)
    compute_amax(q, "percentile", percentile=99.99)
    return fp32, q.eval(), family


def spread(times: list[float], blocks: int = 5) -> float:
    """(max - min) / median of the block medians: how much the figure moved in the run."""
    size = max(1, len(times) // blocks)
    meds = [statistics.median(times[i:i + size]) for i in range(0, len(times), size)]
    return (max(meds) - min(meds)) / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    threads, why = choose_threads(args.threads)
    fp32, q, family = models(args)
    size = args.image_size
    example = torch.rand(2, 3, size, size)
    from trtqat.families.detect.data import datasets, loader
    from trtqat.families.detect.sources import float_layers

    _, val, _ = datasets("digits", size)
    calib = [{"images": x.numpy()} for x, _ in list(loader(val, 8, False))[:4]]
    q.trtqat_skip_layers = float_layers(q)
    results: dict = {"threads": threads, "threads_why": why, "image_size": size,
                     "platform": platform.platform(), "cpu": platform.processor()}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for name, model, variant in (("fp32", fp32, "fp32"), ("int8", q, "int8")):
            plan = image_plan(example)
            plan.input_names, plan.output_names = ["images"], ["output0"]
            plan.checks = family.export_check
            path = Path(tmp) / f"{name}.onnx"
            export_onnx(model, family.stamp_plan(plan), path, variant=variant)
            kwargs = {"threads": threads}
            if name == "int8":
                kwargs.update(ort_prepare="qdq", calib_feeds=calib)
            engines[name] = build_engine(path, "ort", **kwargs)
            import onnx

            counts = count_compute_nodes(onnx.load_model_from_string(engines[name].payload))
            results[f"{name}_nodes"] = {"integer": counts["integer_total"],
                                        "float": counts["float_total"]}
        for b in [int(s) for s in args.batch_sizes.split(",")]:
            feed = {"images": np.random.default_rng(0).random((b, 3, size, size),
                                                             dtype=np.float32)}
            runners = {n: e.runner(threads=threads).__enter__() for n, e in engines.items()}
            try:
                t0 = time.perf_counter()
                times = interleaved(runners, feed, args.rounds, args.warmup)
            finally:
                for r in runners.values():
                    r.__exit__(None, None, None)
            med = {n: statistics.median(t) for n, t in times.items()}
            row = {n: {"median_ms": med[n], "spread": spread(times[n])} for n in times}
            row["speedup"] = med["fp32"] / med["int8"]
            row["wall_s"] = time.perf_counter() - t0
            results[f"batch{b}"] = row
            print(f"batch {b}: fp32 {med['fp32']:.3f} ms (spread {row['fp32']['spread']:.0%}), "
                  f"int8 {med['int8']:.3f} ms (spread {row['int8']['spread']:.0%}): int8 is "
                  f"{row['speedup']:.2f}x fp32", flush=True)
    print(f"nodes (integer/float): fp32 {results['fp32_nodes']}, int8 {results['int8_nodes']}; "
          f"ORT threads {threads} ({why})")
    save_results(Path(args.out or f"runs/detect_speed/{time.strftime('%Y%m%d-%H%M%S')}"),
                 results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""INT8 vs FP32 ORT CPU engines of timm models with modules FX cannot trace.

Each model (random weights: speed and node kinds do not depend on training) goes the
README's Python route: ``trtqat.quantize(model, forward_loop=...)`` (max calibration on
random images), ``trtqat.export_onnx`` in the ``int8`` and ``fp32`` variants, and
``trtqat.build_engine`` (ORT CPU provider, 1 thread). Printed per model: the integer share
of the INT8 engine's conv/matmul nodes, the TensorRT lint warnings, and the latencies of
the two engines timed interleaved (``--rounds`` rounds, batch 1) with their medians, the
FP32/INT8 ratio and the spread of that ratio over the round pairs (interquartile range).

    python benchmarks/untraced_speed.py --models efficientvit_b0,mobilevit_xxs --size 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench import interleaved  # noqa: E402

import trtqat  # noqa: E402
from trtqat.engines.ort_qdq import count_compute_nodes  # noqa: E402

FLOAT_PRODUCTS = ("Conv", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm")


def integer_share(engine) -> tuple[int, int]:
    """``(integer, float)`` conv/matmul nodes of an ORT engine's optimised graph."""
    counts = count_compute_nodes(onnx.load_model_from_string(engine.payload))
    return (sum(counts["integer"].values()) - sum(
        v for k, v in counts["integer"].items() if not k.startswith(
            ("QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "QGemm"))),
            sum(v for k, v in counts["float"].items() if k in FLOAT_PRODUCTS))


def measure(name: str, size: int, rounds: int, out: Path) -> dict:
    """Quantize, export and build ``name``; time its INT8 and FP32 engines interleaved."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10).eval()
    images = torch.randn(8, 3, size, size)
    trtqat.quantize(model, {"method": "max"},
                    forward_loop=lambda m: [m(images[i:i + 4]) for i in (0, 4)])
    engines, lint = {}, []
    for variant in ("int8", "fp32"):
        result = trtqat.export_onnx(model.eval(), images[:1], out / f"{name}-{variant}.onnx",
                                    variant=variant)
        if variant == "int8":
            lint = [w.line() for w in result.lint.warnings] if result.lint else []
        engines[variant] = trtqat.build_engine(result.path, threads=1)
    ints, floats = integer_share(engines["int8"])
    feed = {engines["int8"].inputs[0].name: images[:1].numpy()}
    runners = {k: e.runner(threads=1) for k, e in engines.items()}
    for r in runners.values():
        r.activate()
    times = interleaved(runners, feed, rounds, warmup=5)
    ratios = [f / i for f, i in zip(times["fp32"], times["int8"])]
    q = np.percentile(ratios, [25, 75])
    return {"model": name, "integer": ints, "float": floats, "lint": lint,
            "int8_ms": statistics.median(times["int8"]),
            "fp32_ms": statistics.median(times["fp32"]),
            "ratio": statistics.median(times["fp32"]) / statistics.median(times["int8"]),
            "ratio_iqr": (float(q[0]), float(q[1]))}


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print one block per model."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="efficientvit_b0,mobilevit_xxs")
    p.add_argument("--size", type=int, default=64, help="input height = width")
    p.add_argument("--rounds", type=int, default=200, help="interleaved rounds")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="trtqat-untraced-") as tmp:
        for name in args.models.split(","):
            r = measure(name, args.size, args.rounds, Path(tmp))
            share = r["integer"] / max(1, r["integer"] + r["float"])
            print(f"{name} {args.size}px bs1 1 thread: integer conv/matmul {r['integer']}/"
                  f"{r['integer'] + r['float']} ({share:.0%}); INT8 {r['int8_ms']:.3f} ms, "
                  f"FP32 {r['fp32_ms']:.3f} ms, FP32/INT8 {r['ratio']:.2f}x (round pairs "
                  f"IQR {r['ratio_iqr'][0]:.2f}-{r['ratio_iqr'][1]:.2f}); "
                  f"{len(r['lint'])} lint warning(s)")
            for line in r["lint"]:
                print(f"  {line}")


if __name__ == "__main__":
    main()

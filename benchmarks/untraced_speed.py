"""INT8 vs FP32 ORT CPU engines of timm models with modules FX cannot trace.

Each model (random weights: speed and node kinds do not depend on training) goes the
README's Python route: ``trtqat.quantize(model, forward_loop=...)`` (max calibration on
random images), ``trtqat.export_onnx`` in the ``int8`` and ``fp32`` variants, and
``trtqat.build_engine`` (ORT CPU provider, 1 thread). Printed per model: the integer share
of the INT8 engine's conv/matmul nodes, the TensorRT lint warnings, and the latencies of
the engines timed interleaved (``--rounds`` rounds, batch 1) with their medians, the
FP32/INT8 ratio and the spread of that ratio over the rounds (interquartile range).
``--baseline`` adds the INT8 engine with the untraceable modules' products left float.

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


def _quantized(name: str, images: torch.Tensor, call_sites: bool) -> torch.nn.Module:
    """``name`` built with random weights and quantized; ``call_sites=False`` leaves the
    products of untraceable modules float (trtqat before call-site quantization)."""
    import importlib

    import timm

    place_module = importlib.import_module("trtqat.quant.placement.place")

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10).eval()
    saved = place_module.hook_calls
    if not call_sites:
        place_module.hook_calls = lambda *args, **kwargs: False
    try:
        trtqat.quantize(model, {"method": "max"},
                        forward_loop=lambda m: [m(images[i:i + 4]) for i in (0, 4)])
    finally:
        place_module.hook_calls = saved
    return model.eval()


def measure(name: str, size: int, rounds: int, out: Path, baseline: bool) -> dict:
    """Quantize, export and build ``name``; time its engines interleaved."""
    images = torch.randn(8, 3, size, size, generator=torch.Generator().manual_seed(0))
    engines, lint, shares = {}, [], {}
    kinds = [("int8", True), ("fp32", True)] + ([("int8 float-products", False)]
                                                if baseline else [])
    for label, sites in kinds:
        model = _quantized(name, images, sites)
        variant = label.split()[0]
        result = trtqat.export_onnx(model, images[:1], out / f"{name}-{label[:8]}.onnx",
                                    variant=variant)
        if label == "int8":
            lint = [w.line() for w in result.lint.warnings] if result.lint else []
        engines[label] = trtqat.build_engine(result.path, threads=1)
        if variant == "int8":
            shares[label] = integer_share(engines[label])
    feed = {engines["int8"].inputs[0].name: images[:1].numpy()}
    runners = {k: e.runner(threads=1) for k, e in engines.items()}
    for r in runners.values():
        r.activate()
    times = interleaved(runners, feed, rounds, warmup=5)
    rows = {}
    for label in engines:
        ratios = [f / i for f, i in zip(times["fp32"], times[label])]
        rows[label] = {"ms": statistics.median(times[label]),
                       "ratio": statistics.median(times["fp32"]) /
                       statistics.median(times[label]),
                       "ratio_iqr": tuple(float(v) for v in np.percentile(ratios, [25, 75]))}
    return {"model": name, "shares": shares, "lint": lint, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print one block per model."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="efficientvit_b0,mobilevit_xxs")
    p.add_argument("--size", type=int, default=64, help="input height = width")
    p.add_argument("--rounds", type=int, default=200, help="interleaved rounds")
    p.add_argument("--baseline", action="store_true",
                   help="also time the INT8 engine with the products of untraceable modules "
                        "left float (as before call-site quantization)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="trtqat-untraced-") as tmp:
        for name in args.models.split(","):
            r = measure(name, args.size, args.rounds, Path(tmp), args.baseline)
            print(f"{name} {args.size}px, batch 1, 1 thread, {args.rounds} interleaved rounds, "
                  f"{len(r['lint'])} lint warning(s):")
            for label, row in r["rows"].items():
                share = ""
                if label in r["shares"]:
                    i, f = r["shares"][label]
                    share = f", integer conv/matmul {i}/{i + f} ({i / max(1, i + f):.0%})"
                print(f"  {label:22s} {row['ms']:.3f} ms, FP32/this {row['ratio']:.2f}x (per "
                      f"round IQR {row['ratio_iqr'][0]:.2f}-{row['ratio_iqr'][1]:.2f}){share}")
            for line in r["lint"]:
                print(f"  {line}")


if __name__ == "__main__":
    main()

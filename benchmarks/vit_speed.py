"""INT8 vs FP32 Vision Transformer engines on ONNX Runtime's CPU provider.

``vit_b_16`` with random weights at 224x224, built and quantized by the ViT family
(``trtqat.families.of_model``), calibrated on a few synthetic batches (``--method``),
exported as FP32 (the quantized model's float graph, as ``trtqat export`` writes it; ``--mha``
adds torchvision's own ``nn.MultiheadAttention`` graph) and INT8 (TensorRT-style Q/DQ, lint-checked)
with ``trtqat.export.export_onnx``, and built into ORT CPU engines: FP32 plain, INT8 with the
``qdq`` prepare step (``trtqat.engines.ort_qdq``, which applies the MatMul rewrites the
family's ``engine_hints`` name). The engines run interleaved (alternating order each round)
after a warm-up at each batch size; median, IQR and the FP32/INT8 speed-up (target >= 1.5x)
are printed. ``--profile`` adds ORT's per-node times of the INT8 engine, grouped by op type.
Results go to ``--out/<time>/results.json``.

    python benchmarks/vit_speed.py                        # batch 1 and 32, bounded rounds
    python benchmarks/vit_speed.py --batch-sizes 1 --rounds 20 --profile
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench

from _bench import choose_threads, interleaved, save_results  # noqa: E402

TARGET = 1.5


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_b_16", help="a ViT family name")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated (default 1,32)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds per batch size (default 12 at batch 1, 3 above)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up runs per engine and batch")
    p.add_argument("--threads", type=int, default=None,
                   help="ORT intra-op threads (default: 2 when the 1-minute load is < 0.5 per "
                   "core, else 1)")
    p.add_argument("--method", default="max", choices=["max", "percentile"],
                   help="calibration (percentile: 99.99)")
    p.add_argument("--calib-batches", type=int, default=2)
    p.add_argument("--calib-batch-size", type=int, default=4)
    p.add_argument("--profile", action="store_true", help="ORT per-node profile of INT8")
    p.add_argument("--mha", action="store_true",
                   help="also time the FP32 export of torchvision's nn.MultiheadAttention")
    p.add_argument("--out", default="runs/vit_speed", help="results folder")
    return p.parse_args(argv)


def _log(start: float, text: str) -> None:
    print(f"[{time.perf_counter() - start:6.0f} s] {text}", flush=True)


def _export(args: argparse.Namespace, folder: Path, start: float) -> tuple[dict, list, dict]:
    """({variant: path}, calibration feeds, lint summary) of one calibrated model."""
    import torch

    import trtqat
    from trtqat import families
    from trtqat.export import export_onnx, lint_model
    from trtqat.export.onnx_export import image_plan

    family = families.of_model(args.model)
    torch.manual_seed(0)
    model = family.build(args.model, 1000, image_size=args.image_size).eval()
    qmodel = family.quantize(copy.deepcopy(model)).eval()
    gen = torch.Generator().manual_seed(1)
    size = args.image_size
    calib = [torch.randn(args.calib_batch_size, 3, size, size, generator=gen)
             for _ in range(args.calib_batches)]
    trtqat.collect_stats(qmodel, calib, progress=False)
    kwargs = {"percentile": 99.99} if args.method == "percentile" else {}
    trtqat.compute_amax(qmodel, args.method, **kwargs)
    _log(start, f"{args.model} ({family.name} family) quantized and calibrated ({args.method}, "
         f"{args.calib_batches} x {args.calib_batch_size} synthetic images)")
    paths = {"int8": folder / f"{args.model}_int8.onnx", "fp32": folder / f"{args.model}_fp32.onnx"}
    nets = [("int8", "int8", qmodel), ("fp32", "fp32", qmodel)]  # fp32: quantizers disabled
    if args.mha:
        paths["fp32-mha"] = folder / f"{args.model}_fp32_mha.onnx"
        nets.append(("fp32-mha", "fp32", model))
    for key, variant, net in nets:
        # opset 18: the exporter's own; checking a random 1000-class network against PyTorch
        # says little (near-tied logits), the lint is run below
        plan = family.stamp_plan(image_plan(calib[0][:1]))  # metadata: the engine hints
        export_onnx(net, plan, paths[key], variant=variant, opset=18, validate=False)
        _log(start, f"exported {paths[key].name}")
    lint = lint_model(paths["int8"])
    summary = {"findings": len(lint.findings), "summary": lint.summary()}
    import onnx

    name = onnx.load(str(paths["int8"]), load_external_data=False).graph.input[0].name
    return paths, [{name: c.numpy()} for c in calib], summary


def _log_round(start: float, rounds: int, r: int, times: dict[str, list[float]]) -> None:
    _log(start, f"  round {r + 1}/{rounds}: "
         + ", ".join(f"{n} {v[-1]:.0f} ms" for n, v in times.items()))


def _spread(values: list[float]) -> dict[str, float]:
    from trtqat.engines.timing import median

    s = sorted(values)
    q1, q3 = np.percentile(s, [25, 75])
    return {"median_ms": median(s), "iqr_ms": float(q3 - q1), "min_ms": s[0], "max_ms": s[-1]}


def _profile(runner: Any, feed: dict) -> dict[str, float]:
    """Mean ms per op type (``profile_layers`` names nodes ``NAME [OP]``)."""
    per_node = runner.profile_layers(feed, iterations=3)
    by_op: dict[str, float] = defaultdict(float)
    for node, ms in per_node.items():
        by_op[node.rsplit("[", 1)[-1].rstrip("]") if node.endswith("]") else node] += ms
    return dict(sorted(by_op.items(), key=lambda kv: -kv[1]))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    import onnx
    import onnxruntime
    import torch

    from trtqat.engines import build_engine
    from trtqat.engines.ort_qdq import count_compute_nodes
    from trtqat.engines.ort_u8s8 import reencode_report

    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    out_dir = Path(args.out) / f"{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, feeds, lint = _export(args, out_dir, start)
    engines = {k: build_engine(p, "ort", threads=threads, ort_prepare="none")
               for k, p in paths.items() if k != "int8"}
    # min_top1=0: a random network's near-tied logits make the re-encoding's top-1 check
    # meaningless; the agreement figures are reported instead
    engines["int8"] = build_engine(paths["int8"], "ort", threads=threads, ort_prepare="qdq",
                                   calib_feeds=tuple(feeds), min_top1=0.0)
    int8_model = onnx.load_from_string(engines["int8"].payload)
    report = reencode_report(int8_model)
    _log(start, "engines built")
    results: dict[str, Any] = {"batches": {}, "lint": lint,
                               "int8_compute_nodes": count_compute_nodes(int8_model),
                               "int8_reencode_passes": report.get("passes"),
                               "int8_reencode_agreement": report.get("agreement")}
    runners = {name: e.runner(threads=threads) for name, e in engines.items()}
    for r in runners.values():
        r.__enter__()
    try:
        gen = np.random.default_rng(2)
        for batch in [int(b) for b in args.batch_sizes.split(",") if b.strip()]:
            rounds = args.rounds or (12 if batch == 1 else 3)
            size = args.image_size
            feed = {next(iter(feeds[0])): gen.standard_normal(
                (batch, 3, size, size), dtype=np.float32)}
            _log(start, f"batch {batch}: {rounds} interleaved rounds")
            times = interleaved(runners, feed, rounds, args.warmup,
                                functools.partial(_log_round, start, rounds))
            outs = {n: next(iter(r.infer(feed).values())) for n, r in runners.items()}
            spread = {n: _spread(t) for n, t in times.items()}
            results["batches"][batch] = {
                **spread, "rounds": rounds, "times_ms": times,
                "fp32_over_int8": spread["fp32"]["median_ms"] / spread["int8"]["median_ms"],
                "top1_agreement_int8_vs_fp32": float(
                    (outs["int8"].argmax(-1) == outs["fp32"].argmax(-1)).mean())}
            if "fp32-mha" in spread:
                results["batches"][batch]["fp32_mha_over_int8"] = (
                    spread["fp32-mha"]["median_ms"] / spread["int8"]["median_ms"])
            if args.profile:
                results["batches"][batch]["int8_profile_ms"] = _profile(runners["int8"], feed)
                results["batches"][batch]["fp32_profile_ms"] = _profile(runners["fp32"], feed)
    finally:
        for r in runners.values():
            r.__exit__(None, None, None)
    results["config"] = {
        "model": args.model, "image_size": args.image_size, "threads": threads,
        "threads_reason": why, "calibration": f"{args.method}, {args.calib_batches} x "
        f"{args.calib_batch_size} synthetic", "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(), "wall_s": round(time.perf_counter() - start, 1)}
    _print(results)
    save_results(out_dir, results)
    return results


def _print(results: dict[str, Any]) -> None:
    cfg = results["config"]
    print(f"\n{cfg['model']} {cfg['image_size']}x{cfg['image_size']}, random weights, ORT "
          f"{cfg['onnxruntime']} CPU provider, {cfg['threads']} thread(s) "
          f"({cfg['threads_reason']}), calibration {cfg['calibration']}")
    print(f"{'batch':>5}  {'FP32 median (IQR) ms':>24}  {'INT8 median (IQR) ms':>24}  "
          f"FP32/INT8 (target >= {TARGET}x)")
    for batch, r in results["batches"].items():
        f, i = r["fp32"], r["int8"]
        ratio = r["fp32_over_int8"]
        print(f"{batch:>5}  {f['median_ms']:12.1f} ({f['iqr_ms']:7.1f})  "
              f"{i['median_ms']:12.1f} ({i['iqr_ms']:7.1f})  {ratio:6.2f}x "
              f"{'PASS' if ratio >= TARGET else 'FAIL'}  (top-1 agreement "
              f"{r['top1_agreement_int8_vs_fp32']:.2f}, {r['rounds']} rounds)")
        if "fp32-mha" in r:
            m = r["fp32-mha"]
            print(f"       FP32 nn.MultiheadAttention graph: {m['median_ms']:.1f} "
                  f"({m['iqr_ms']:.1f}) ms, {r['fp32_mha_over_int8']:.2f}x")
        for name in ("int8_profile_ms", "fp32_profile_ms"):
            if name in r:
                top = ", ".join(f"{op} {ms:.1f}" for op, ms in list(r[name].items())[:8])
                print(f"       {name.split('_')[0]} ms by op: {top}")
    n = results["int8_compute_nodes"]
    print(f"INT8 engine: integer {n['integer_total']} ({n['integer']}), float "
          f"{n['float_total']} ({n['float']}), Q/DQ {n['quantize_dequantize']}")
    print(f"INT8 ONNX lint: {results['lint']['summary']}")
    agreement = results.get("int8_reencode_agreement") or {}
    if agreement:
        print(f"ORT re-encoding vs its Q/DQ ONNX: top-1 agreement "
              f"{agreement.get('top1_agreement', 0):.2f}, max abs diff "
              f"{agreement.get('max_abs_diff', 0):.3g} (max |logit| "
              f"{agreement.get('max_abs_reference', 0):.3g})")


if __name__ == "__main__":
    main()

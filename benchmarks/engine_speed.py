"""Engine speed of the exported precision variants, measured the way trtexec does.

A torchvision model (random weights: speed does not depend on them) is exported in each
variant with ``trtqat.export.export_onnx(model, example_inputs, path, variant=...)``; the
INT8 variants come from a PTQ-calibrated copy (``trtqat.quantize`` + max calibration on
random batches). Each ONNX is built into an engine (``--backend ort``: plain ORT, and for
INT8 also with the ``qdq`` prepare step that re-encodes Q/DQ for ORT's integer CPU kernels;
``--backend tensorrt`` on a GPU machine) and timed with trtexec's model (warm-up, duration,
iterations, percentiles). Outputs are compared with the FP32 engine on the same inputs.

A variant that fails is recorded with its error, not fatal. Results and configuration go to
``runs/engine_speed/<time>/results.json`` and ``results.md``. Run with ``-h`` for options.

``--cpu-int8`` (``--cpu-int8 -h`` for its options) instead compares, on ORT's CPU provider
with interleaved runs and medians, the QAT INT8 engine re-encoded for integer kernels
(``trtqat.engines.ort_qdq``) with the FP32 engine and with ORT's own ``quantize_static``,
and prints both ratios and the integer/float node counts, e.g.
``python benchmarks/engine_speed.py --cpu-int8 --batch-sizes 1,32 --image-size 224 --quick``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench import ort_ptq  # noqa: E402

import trtqat  # noqa: E402
from trtqat.engines import BenchmarkSettings, build_engine, random_feed  # noqa: E402

VARIANTS = ("fp32", "fp16", "int8", "int8-fp16")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", help="torchvision model name")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", type=int, default=224, help="input height = width")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    p.add_argument("--backend", default="ort", choices=["ort", "tensorrt"])
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--warmup", type=float, default=200.0, help="ms (trtexec --warmUp)")
    p.add_argument("--duration", type=float, default=3.0, help="s (trtexec --duration)")
    p.add_argument("--iterations", type=int, default=10, help="trtexec --iterations")
    p.add_argument("--calib-batches", type=int, default=4)
    p.add_argument("--no-reencode", action="store_true", help="skip the ORT 'qdq' step")
    p.add_argument("--out", default="runs/engine_speed", help="results folder")
    return p.parse_args(argv)


def _float_model(name: str) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.get_model(name, weights=None).eval()


def _calibrated(model: torch.nn.Module, shape: tuple[int, ...], batches: int) -> torch.nn.Module:
    qmodel = trtqat.quantize(copy.deepcopy(model))
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(shape, generator=gen) for _ in range(batches)]
    trtqat.collect_stats(qmodel, data, num_batches=batches, progress=False)
    trtqat.compute_amax(qmodel, "max")
    return qmodel.eval()


def _engines(variant: str, args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(label, build options) for one exported variant."""
    options: dict[str, Any] = {"threads": args.threads} if args.backend == "ort" else {}
    runs = [(variant, options)]
    if args.backend == "ort" and variant.startswith("int8") and not args.no_reencode:
        runs.append((f"{variant} + cpu re-encode", dict(options, ort_prepare="qdq")))
    return runs


def _compare(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    out, ref = out.astype(np.float32), ref.astype(np.float32)
    agree = float(np.mean(out.reshape(len(out), -1).argmax(1) == ref.reshape(len(ref), -1)
                          .argmax(1)))
    return {"max_abs_diff": float(np.max(np.abs(out - ref))), "top1_agreement": agree}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the sweep; returns the results dictionary that is also written to disk."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--cpu-int8" in argv:
        return cpu_int8_main([a for a in argv if a != "--cpu-int8"])
    args = _parse(argv)
    try:
        from trtqat.export import export_onnx
    except ImportError as exc:
        print(f"engine_speed: trtqat.export.export_onnx is not available yet ({exc})",
              file=sys.stderr)
        raise SystemExit(2) from None
    torch.set_num_threads(args.threads)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out) / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = (args.batch, 3, args.size, args.size)
    example = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    settings = BenchmarkSettings(warmup_ms=args.warmup, duration_s=args.duration,
                                 iterations=args.iterations)
    float_model = _float_model(args.model)
    int8_model = None
    config = {"args": vars(args), "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count(),
              "torch": torch.__version__, "trtqat": trtqat.__version__}
    try:
        import onnxruntime

        config["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    results: dict[str, Any] = {"config": config, "runs": []}
    reference: dict[str, np.ndarray] | None = None
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        onnx_path = out_dir / f"{args.model}_{variant}.onnx"
        try:
            if variant.startswith("int8") and int8_model is None:
                int8_model = _calibrated(float_model, shape, args.calib_batches)
            model = int8_model if variant.startswith("int8") else float_model
            export_onnx(model, (example,), str(onnx_path), variant=variant)
        except Exception as exc:  # record and go on: one broken variant must not end a sweep
            results["runs"].append({"engine": variant, "error": f"export: {exc!r}"})
            print(f"{variant}: export failed: {exc!r}", file=sys.stderr)
            continue
        for label, options in _engines(variant, args):
            record: dict[str, Any] = {"engine": label, "onnx": str(onnx_path),
                                      "build_options": options}
            try:
                start = time.perf_counter()
                engine = build_engine(onnx_path, args.backend, shapes={
                    spec.name: shape for spec in _inputs(onnx_path)}, **options)
                record["build_s"] = round(time.perf_counter() - start, 3)
                engine_path = engine.save(out_dir / f"{label.replace(' ', '_')}.engine")
                record["engine_bytes"] = engine_path.stat().st_size
                feed = random_feed(engine.inputs, seed=3)
                with engine.runner() as runner:
                    outputs = runner.infer(feed)
                    bench = runner.benchmark(feed, settings)
                first = next(iter(outputs.values()))
                if reference is None and variant == "fp32":
                    reference = {"out": first}
                if reference is not None:
                    record.update(_compare(first, reference["out"]))
                record["timing"] = bench.to_dict()
                record["summary"] = bench.summary_lines()
                print(f"--- {label}")
                print("\n".join(bench.summary_lines()))
            except Exception as exc:
                record["error"] = repr(exc)
                record["traceback"] = traceback.format_exc(limit=5)
                print(f"{label}: failed: {exc!r}", file=sys.stderr)
            results["runs"].append(record)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    table = _table(results)
    (out_dir / "results.md").write_text(table + "\n")
    print(table)
    print(f"results in {out_dir}")
    return results


def _inputs(onnx_path: Path) -> list[Any]:
    from trtqat.engines.onnx_io import load_onnx, onnx_input_specs

    return list(onnx_input_specs(load_onnx(onnx_path)))


def _table(results: dict[str, Any]) -> str:
    cfg = results["config"]["args"]
    lines = [f"{cfg['model']} batch {cfg['batch']} {cfg['size']}x{cfg['size']}, backend "
             f"{cfg['backend']}, {cfg['threads']} threads (trtexec model: warm-up "
             f"{cfg['warmup']} ms, >= {cfg['duration']} s, >= {cfg['iterations']} queries)", "",
             "| engine | median compute ms | p99 ms | qps | x fp32 | max abs diff | top-1 agree |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    base = None
    for run in results["runs"]:
        if "timing" in run and run["engine"] == "fp32":
            base = run["timing"]["compute"]["median"]
    for run in results["runs"]:
        if "timing" not in run:
            lines.append(f"| {run['engine']} | failed: {run.get('error', '?')[:60]} |||||| ")
            continue
        compute = run["timing"]["compute"]
        p99 = compute["percentiles"].get(99.0, compute["percentiles"].get("99.0", float("nan")))
        speedup = f"{base / compute['median']:.2f}" if base else "-"
        lines.append(f"| {run['engine']} | {compute['median']:.3f} | {p99:.3f} | "
                     f"{run['timing']['throughput_qps']:.1f} | {speedup} | "
                     f"{run.get('max_abs_diff', float('nan')):.4g} | "
                     f"{run.get('top1_agreement', float('nan')):.3f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ --cpu-int8 comparison
# Our QAT INT8 engine for ORT's CPU provider (the TensorRT-style Q/DQ ONNX re-encoded by
# trtqat.engines.ort_qdq) side by side with our FP32 engine and with the same FP32 network
# quantized by ONNX Runtime's own quantize_static; runs interleaved, medians compared.
CPU_INT8_TARGETS = {"fp32 / int8": 1.8, "int8 / ort-ptq": 1.1}  # >= and <=


def _parse_cpu_int8(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="engine_speed.py --cpu-int8",
        description="QAT INT8 (re-encoded for ORT's CPU integer kernels) vs FP32 vs ORT's "
                    "quantize_static, ORT CPU provider, interleaved runs, medians")
    p.add_argument("--model", default="resnet18", help="torchvision or timm model name")
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    p.add_argument("--reps", type=int, default=None,
                   help="timed runs per engine and batch size (default 30, 8 with --quick)")
    p.add_argument("--calib-batches", type=int, default=None, help="default 4 (2 with --quick)")
    p.add_argument("--calib-batch-size", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="fewer runs and calibration batches")
    p.add_argument("--no-raw", action="store_true",
                   help="do not time the INT8 ONNX as exported (no re-encoding)")
    p.add_argument("--residual-amax-factor", type=float, default=1.0,
                   help="scale the residual quantizers' amax (e.g. 0.9: ranges learned apart "
                        "from the next conv's, as after QAT) and also time the re-encoding "
                        "without quantizer unification")
    p.add_argument("--out", default="runs/engine_speed", help="results folder")
    args = p.parse_args(argv)
    args.reps = args.reps or (8 if args.quick else 30)
    args.calib_batches = args.calib_batches or (2 if args.quick else 4)
    return args


def _cpu_int8_onnx(args: argparse.Namespace, out_dir: Path) -> tuple[Path, Path, list]:
    """Export the INT8 (TensorRT-style Q/DQ) and FP32 ONNX of one calibrated model."""
    from trtqat.export import export_onnx
    from trtqat.families.cnn.model_source import build
    from trtqat.stages.zoo import settle_batchnorm

    torch.manual_seed(0)
    model = build(args.model, 1000, quantized=True).eval()  # torchvision or timm name
    gen = torch.Generator().manual_seed(1)
    size = args.image_size
    calib = [torch.randn(args.calib_batch_size, 3, size, size, generator=gen)
             for _ in range(args.calib_batches)]
    # random weights: BatchNorm statistics from the same images, or activations vanish and
    # every output ties (see trtqat.stages.zoo.settle_batchnorm)
    settle_batchnorm(model, calib)
    trtqat.collect_stats(model, calib, progress=False)
    trtqat.compute_amax(model, "max")
    if args.residual_amax_factor != 1.0:
        for module in model.modules():
            quantizer = getattr(module, "residual_quantizer", None)
            if quantizer is not None and quantizer.amax is not None:
                quantizer.amax = quantizer.amax * args.residual_amax_factor
    paths = out_dir / f"{args.model}_int8.onnx", out_dir / f"{args.model}_fp32.onnx"
    for path, variant in zip(paths, ("int8", "fp32")):
        # opset 18: the exporter's own, no version conversion; validation against PyTorch is
        # the export's own business (and a random network is hypersensitive to it)
        export_onnx(model, (calib[0][:1],), str(path), variant=variant, opset=18,
                    validate=False)
    import onnx

    name = onnx.load(str(paths[0])).graph.input[0].name
    return paths[0], paths[1], [{name: c.numpy()} for c in calib]


def _interleaved(sessions: dict[str, Any], feed: dict[str, np.ndarray], reps: int,
                 warmup: int = 3) -> dict[str, list[float]]:
    """Latency (ms) of each session, one run of each per round, rotating the order."""
    names = list(sessions)
    for name in names:
        for _ in range(warmup):
            sessions[name].run(None, feed)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            sessions[name].run(None, feed)
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def cpu_int8_main(argv: Sequence[str]) -> dict[str, Any]:
    """``--cpu-int8``: the CPU INT8 comparison; returns (and writes) its results."""
    import onnx
    import onnxruntime

    from trtqat.engines.ort_qdq import (
        count_compute_nodes,
        cpu_session,
        optimized_model,
        reencode_for_cpu,
    )

    args = _parse_cpu_int8(argv)
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out) / f"cpu_int8_{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{args.model} {args.image_size}x{args.image_size}, ORT {onnxruntime.__version__} CPU "
          f"provider, {args.threads} threads, {args.reps} interleaved runs per engine: "
          "random-initialised weights, calibrated on "
          f"{args.calib_batches}x{args.calib_batch_size} random images (speed does not "
          "depend on training)")
    int8_path, fp32_path, feeds = _cpu_int8_onnx(args, out_dir)
    ptq_path = ort_ptq(fp32_path, out_dir / f"{args.model}_ort_ptq.onnx", feeds)
    int8 = onnx.load(str(int8_path))
    models = {"fp32": onnx.load(str(fp32_path)), "ort-ptq": onnx.load(str(ptq_path))}
    # agreement with the exported ONNX is recorded, not enforced: the outputs of a random
    # network are near-constant and their top-1 is noise
    models["int8"], report = reencode_for_cpu(int8, feeds, threads=args.threads, min_top1=0.0,
                                              min_cosine=-1.0)
    reports = {"int8": report}
    # what `trtqat build --backend ort` makes of the file: no calibration inputs, checked on
    # synthetic ones, the faithful re-encoding if the full one fails that check
    engine = build_engine(str(int8_path), "ort", threads=args.threads)
    models["int8 engine"] = onnx.load_from_string(engine.payload)
    verdict = json.loads(next((p.value for p in models["int8 engine"].metadata_props
                               if p.key == "trtqat.cpu_reencode"), "{}")).get("verdict")
    if args.residual_amax_factor != 1.0:
        models["int8 no-unify"], reports["int8 no-unify"] = reencode_for_cpu(
            int8, feeds, threads=args.threads, unify=False, min_top1=0.0, min_cosine=-1.0)
    if not args.no_raw:
        models["int8 as exported"] = int8
    onnx.save(models["int8"], str(out_dir / f"{args.model}_int8_cpu.onnx"))
    counts = {name: count_compute_nodes(optimized_model(m, args.threads))
              for name, m in models.items()}
    results: dict[str, Any] = {
        "config": {"args": vars(args), "onnxruntime": onnxruntime.__version__,
                   "torch": torch.__version__, "machine": platform.machine(),
                   "cpus": os.cpu_count(), "weights": "random init, synthetic calibration"},
        "reencode": reports, "engine_verdict": verdict, "compute_nodes": counts,
        "batches": {}}
    for batch in [int(b) for b in args.batch_sizes.split(",") if b.strip()]:
        feed = {int8.graph.input[0].name: np.random.default_rng(batch).standard_normal(
            (batch, 3, args.image_size, args.image_size)).astype(np.float32)}
        sessions = {name: cpu_session(m, args.threads) for name, m in models.items()
                    if name != "int8 as exported" or batch == 1 or not args.quick}
        times = _interleaved(sessions, feed, args.reps)
        med = {name: float(np.median(t)) for name, t in times.items()}
        ratios = {"fp32 / int8": med["fp32"] / med["int8"],
                  "int8 / ort-ptq": med["int8"] / med["ort-ptq"],
                  "fp32 / int8 engine": med["fp32"] / med["int8 engine"],
                  "int8 engine / ort-ptq": med["int8 engine"] / med["ort-ptq"]}
        results["batches"][batch] = {"median_ms": med, "ratios": ratios, "times_ms": times}
        print(f"\nbatch {batch}: median latency (ms, {args.reps} interleaved runs)")
        for name, value in med.items():
            print(f"  {name:<22} {value:9.2f}   p25 {np.percentile(times[name], 25):8.2f}"
                  f"   p75 {np.percentile(times[name], 75):8.2f}")
        for key, value in ratios.items():
            target = CPU_INT8_TARGETS[key.replace(" engine", "")]
            ok = value >= target if key.startswith("fp32") else value <= target
            sign = ">=" if key.startswith("fp32") else "<="
            print(f"  {key:<22} {value:9.2f}x  (target {sign} {target}: "
                  f"{'PASS' if ok else 'FAIL'})")
    print("\ninteger / float compute nodes in ORT's optimised graph:")
    for name, c in counts.items():
        detail = ", ".join(f"{k} {v}" for k, v in sorted(c["integer"].items()))
        fdetail = ", ".join(f"{k} {v}" for k, v in sorted(c["float"].items()))
        print(f"  {name:<22} integer {c['integer_total']:3d} ({detail or '-'}); "
              f"float {c['float_total']:3d} ({fdetail or '-'}); Q/DQ {c['quantize_dequantize']}")
    for name, rep in reports.items():
        agreement = rep.get("agreement", {})
        print(f"\n{name} re-encoding: {json.dumps(rep['passes'])}\n  agreement with the INT8 "
              f"ONNX as exported on the calibration images: top-1 "
              f"{agreement.get('top1_agreement', 0):.1%}, max abs diff "
              f"{agreement.get('max_abs_diff', float('nan')):.4g} (outputs up to "
              f"{agreement.get('max_abs_reference', float('nan')):.4g}), mean abs diff "
              f"{agreement.get('mean_abs_diff', float('nan')):.3g}, mean centered cosine "
              f"{agreement.get('mean_centered_cosine', float('nan')):.4f}")
    print(f"\nint8 engine (trtqat build --backend ort, no calibration inputs): {verdict}")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"results in {out_dir}")
    return results


if __name__ == "__main__":
    main()

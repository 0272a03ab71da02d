"""The torchvision classification zoo at its usual input size: PTQ export status and ONNX
Runtime INT8 / ORT-PTQ / FP32 speed on the CPU.

Each model (random weights: speed does not depend on them, see ``trtqat.stages.zoo``) goes through
max calibration, the checked INT8 export, the Q/DQ lint and an ORT engine (``trtqat.stages.zoo.
run_ptq``: the TensorRT-style Q/DQ re-encoded for ORT's integer CPU kernels, calibrated and
checked on the calibration batches); its FP32 export is built too, and ONNX Runtime's own
``quantize_static`` (QDQ, uint8 activations, int8 per-channel weights, MinMax) of that FP32
ONNX, calibrated on the same batches, is built as "ORT PTQ" and run as ORT runs it. The
engines are timed in interleaved rotated rounds (:func:`time_rounds`: trtexec's compute time
with fixed I/O buffers) at every ``--batch-sizes``: each figure is the median over rounds of
the per-round medians, with its spread
``(max - min) / median``, flagged ``!`` above 10%; each ratio is the median of the per-round
ratios, with their spread.

Targets (issue 25): INT8 latency <= 1.1x ORT PTQ's, and INT8 faster than FP32 wherever ORT
PTQ is. On x86 CPUs without VNNI our engine keeps exact integer results (uint8 weights where
ORT's u8s8 kernels would saturate, ``trtqat.engines.ort_u8s8``) while ORT PTQ runs the
saturating kernels; ``--fast`` also times our engine built the same way (``trtqat-exec
--cpuInt8=fast``).

A model that fails is recorded with the failed stage and error; the sweep goes on. The
agreement of the re-encoded engine with the exported ONNX is recorded, never enforced
(random weights give near-constant outputs whose top-1 is noise). Results go to
``<out>/results.json`` and ``results.md``. Example:
``python benchmarks/zoo.py --models mobilenet_v2,shufflenet_v2_x1_0 --threads 1``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench import ort_ptq  # noqa: E402

from trtqat.stages.zoo import (  # noqa: E402
    USUAL_SIZE,
    ZOO,
    ZooResult,
    format_results,
    quantized_model,
    run_ptq,
    synthetic_batches,
)

CALIB_BATCHES, CALIB_BATCH = 2, 4  # run_ptq's calibration data, reused for ORT PTQ
TARGET_VS_PTQ = 1.1  # INT8 latency / ORT PTQ latency <=
UNSTABLE_SPREAD = 0.10  # a figure whose spread over rounds exceeds this is flagged "!"

Rounds = dict[str, dict[int, list[float]]]  # engine -> batch -> per-round median ms


def spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def time_rounds(engines: dict[str, Any], feeds: dict[int, dict[str, np.ndarray]],
                threads: int, rounds: int, seconds: float, warmup_ms: float) -> Rounds:
    """Compute time (ms) of every engine at every batch size: in each round every engine in
    turn (the order rotated between rounds) runs queries for ``seconds / rounds`` (at least
    one, trtexec's timing with fixed I/O buffers) and contributes their median."""
    import contextlib

    from trtqat.engines import BenchmarkSettings

    names = list(engines)
    out: Rounds = {n: {b: [] for b in feeds} for n in names}
    with contextlib.ExitStack() as stack:
        runners = {n: stack.enter_context(engines[n].runner(threads=threads)) for n in names}
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                for b, feed in feeds.items():
                    settings = BenchmarkSettings(warmup_ms=warmup_ms, iterations=1, batch=b,
                                                 duration_s=seconds / rounds,
                                                 data_transfers=False)
                    bench = runners[n].benchmark(dict(feed), settings)
                    out[n][b].append(float(bench.stats("compute_ms").median))
    return out


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ZOO.values()),
                   help="comma-separated torchvision names (default: one per family)")
    p.add_argument("--size", type=int, default=None, help=f"input size (default: {USUAL_SIZE})")
    p.add_argument("--batch-sizes", default="1,32", help="timed batch sizes, comma-separated")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--duration", type=float, default=3.0,
                   help="s per engine and batch size, over all rounds")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--warmup", type=float, default=200.0, help="ms before each round")
    p.add_argument("--fast", "--unguarded", dest="fast", action="store_true",
                   help="also time our INT8 engine built with ORT's saturating u8s8 kernels "
                   "(trtqat-exec --cpuInt8=fast)")
    p.add_argument("--out", default="runs/zoo", help="results folder")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch-sizes must be integers, got {args.batch_sizes!r}")
    if not args.batch_sizes or min(args.batch_sizes) < 1 or args.threads < 1 \
            or args.rounds < 1 or not args.duration > 0:
        p.error("--batch-sizes, --threads, --rounds must be >= 1 and --duration > 0")
    return args


def _fp32_onnx(model: torch.nn.Module, name: str, size: int, out: Path) -> Path:
    from trtqat.export import export_onnx
    from trtqat.variants import artifact_name

    path = out / artifact_name(f"{name}_{size}", "", "fp32")
    export_onnx(model, synthetic_batches(1, 2, size, 2)[0], path, "fp32")
    return path


def _engines(model, result: ZooResult, size: int, out: Path, args) -> dict[str, Any]:
    """Our INT8 engine (from run_ptq), FP32, ORT PTQ (and our INT8 with --cpuInt8=fast)."""
    from trtqat.engines import build_engine

    fp32 = _fp32_onnx(model, result.name, size, out)
    feeds = [{"input": x.numpy()} for x in synthetic_batches(CALIB_BATCHES, CALIB_BATCH, size)]
    engines = {"int8": result.engine, "ort-ptq": build_engine(
        ort_ptq(fp32, fp32.with_name(fp32.stem.replace("-fp32", "") + "-ort-ptq.onnx"),
                feeds), "ort", threads=args.threads, ort_prepare="none",
        u8s8_guard=False)}
    if args.fast:
        engines["int8 fast"] = build_engine(result.onnx, "ort", threads=args.threads,
                                                 calib_feeds=feeds, min_top1=0.0,
                                                 u8s8_guard=False)
    engines["fp32"] = build_engine(fp32, "ort", threads=args.threads)
    return engines


def _figure(times: Rounds, name: str, batch: int) -> str:
    values = times.get(name, {}).get(batch) or []
    if not values:
        return "-"
    sp = spread(values)
    return f"{statistics.median(values):.2f} ms ±{sp:.0%}" + (" !" if sp > UNSTABLE_SPREAD else "")


def ratio(times: Rounds, num: str, den: str, batch: int) -> tuple[float, float] | None:
    """Median and spread of the per-round latency ratios ``num / den``."""
    a = times.get(num, {}).get(batch) or []
    b = times.get(den, {}).get(batch) or []
    if not a or len(a) != len(b):
        return None
    values = [x / y for x, y in zip(a, b)]
    return statistics.median(values), spread(values)


def _ratio_text(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:.2f}x ±{r[1]:.0%}"


def _agreement(engine: Any) -> dict[str, Any]:
    """The re-encoding report's agreement figures (from the engine's model metadata)."""
    import onnx

    from trtqat.engines.ort_u8s8 import reencode_report

    report = reencode_report(onnx.load_from_string(engine.payload))
    return dict(report.get("agreement") or {}, cpu=report.get("cpu"))


def fidelity(engines: dict[str, Any], size: int, threads: int) -> dict[str, float]:
    """Mean centered cosine of each engine's scores with the FP32 engine's on 16 images
    not used for calibration (meaningful for a random network's near-constant scores)."""
    from trtqat.engines.ort_inspect import mean_centered_cosine

    feed = {"input": synthetic_batches(1, 16, size, 7)[0].numpy()}
    out = {}
    for name, engine in engines.items():
        with engine.runner(threads=threads) as runner:
            out[name] = next(iter(runner.infer(feed).values()))
    return {n: round(mean_centered_cosine([out["fp32"]], [y]), 5) for n, y in out.items()
            if n != "fp32"}


def _verdict(times: Rounds, batch: int, ours: str = "int8") -> str:
    vs_ptq = ratio(times, ours, "ort-ptq", batch)
    vs_fp32 = ratio(times, "fp32", ours, batch)
    ptq_fast = ratio(times, "fp32", "ort-ptq", batch)
    if vs_ptq is None or vs_fp32 is None or ptq_fast is None:
        return "-"
    ok = vs_ptq[0] <= TARGET_VS_PTQ and (ptq_fast[0] <= 1.0 or vs_fp32[0] > 1.0)
    return "PASS" if ok else "MISS"


def _line(times: Rounds, names: list[str], b: int) -> str:
    return ("  ".join(f"{n} {_figure(times, n, b)}" for n in names)
            + f"  | int8/ort-ptq {_ratio_text(ratio(times, 'int8', 'ort-ptq', b))}"
            f"  fp32/int8 {_ratio_text(ratio(times, 'fp32', 'int8', b))}"
            f"  fp32/ort-ptq {_ratio_text(ratio(times, 'fp32', 'ort-ptq', b))}"
            f"  {_verdict(times, b)}" + _fast_text(times, b))


def _fast_cells(times: Rounds, b: int) -> list[str]:
    """INT8 fast / ORT PTQ, FP32 / INT8 fast and its verdict (when --fast timed it)."""
    if "int8 fast" not in times:
        return []
    return [_ratio_text(ratio(times, "int8 fast", "ort-ptq", b)),
            _ratio_text(ratio(times, "fp32", "int8 fast", b)), _verdict(times, b, "int8 fast")]


def _fast_text(times: Rounds, b: int) -> str:
    cells = _fast_cells(times, b)
    return "" if not cells else (f"  fast/ort-ptq {cells[0]}  fp32/fast {cells[1]}  "
                                 f"fast {cells[2]}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; exit 1 if any model failed."""
    args = _parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    names = ["int8", "ort-ptq"] + (["int8 fast"] if args.fast else []) + ["fp32"]
    rows: list[tuple[ZooResult, Rounds, dict[str, Any]]] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        size = args.size or USUAL_SIZE
        print(f"{name} at {size} px: calibrate, export, lint, engines ...", flush=True)
        model = quantized_model(name)
        result = run_ptq(name, size, out, model=model, calib_batches=CALIB_BATCHES,
                         batch=CALIB_BATCH, engine_threads=args.threads)
        times: Rounds = {}
        extra: dict[str, Any] = {}
        if result.status == "ok":
            try:
                engines = _engines(model, result, size, out, args)
            except Exception as exc:  # ORT PTQ or FP32 build: record, keep the sweep going
                result.status, result.stage = "failed", "baselines"
                result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            else:
                extra["agreement"] = _agreement(result.engine)
                extra["cos_vs_fp32"] = fidelity(engines, size, args.threads)
                extra["nodes"] = {n: e.header.get("compute_nodes") for n, e in engines.items()}
                feeds = {b: {"input": synthetic_batches(1, b, size, 9)[0].numpy()}
                         for b in args.batch_sizes}
                times = time_rounds(engines, feeds, args.threads, args.rounds, args.duration,
                                    args.warmup)
        rows.append((result, times, extra))
        print(format_results([result]), flush=True)
        if "cos_vs_fp32" in extra:
            agree = extra["agreement"]
            print(f"  centered cosine of the scores with FP32: {extra['cos_vs_fp32']}; INT8 vs "
                  f"its ONNX: top-1 {agree.get('top1_agreement', float('nan')):.0%}, centered "
                  f"cosine {agree.get('mean_centered_cosine', float('nan')):.4f}", flush=True)
        for b in args.batch_sizes:
            print(f"  batch {b:>3}: {_line(times, names, b)}", flush=True)
    md = _table(rows, names, args)
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"settings": vars(args), "models": [
            r.to_json() | extra | {"compute_ms_per_round": times}
            for r, times, extra in rows]}, indent=2, default=str))
    print("\n".join(md))
    return 1 if any(r.status != "ok" for r, _, _ in rows) else 0


def _table(rows, names: list[str], args) -> list[str]:
    fast = "int8 fast" in names
    md = ["| model | batch | " + " | ".join(names) + " | INT8 / ORT PTQ | FP32 / INT8 | "
          "FP32 / ORT PTQ | target | cos vs FP32 |"
          + (" fast / ORT PTQ | FP32 / fast | fast target |" if fast else ""),
          "|---|---:|" + "---:|" * (len(names) + 5 + 3 * fast)]
    for r, times, extra in rows:
        cos = extra.get("cos_vs_fp32") or {}
        cos_text = " / ".join(f"{cos[n]:.4f}" for n in names if n in cos)
        if r.status != "ok":
            md.append(f"| {r.name} | - | failed ({r.stage}): {r.error} |"
                      + " |" * (len(names) + 4 + 3 * fast))
            continue
        for b in args.batch_sizes:
            md.append(f"| {r.name} | {b} | "
                      + " | ".join(_figure(times, n, b) for n in names)
                      + f" | {_ratio_text(ratio(times, 'int8', 'ort-ptq', b))}"
                      f" | {_ratio_text(ratio(times, 'fp32', 'int8', b))}"
                      f" | {_ratio_text(ratio(times, 'fp32', 'ort-ptq', b))}"
                      f" | {_verdict(times, b)} | {cos_text} |"
                      + "".join(f" {c} |" for c in _fast_cells(times, b)))
    md += ["", f"ORT CPU compute time, {args.threads} thread(s), {args.size or USUAL_SIZE} px; median over "
           f"{args.rounds} interleaved rounds ±(max - min) / median; ! = spread > "
           f"{UNSTABLE_SPREAD:.0%}; ratios: median of the per-round ratios ± their spread. "
           "Random weights, BatchNorm settled and max calibration on synthetic images; "
           f"ORT PTQ calibrated on the same {CALIB_BATCHES}x{CALIB_BATCH} images. Target: "
           f"INT8 / ORT PTQ <= {TARGET_VS_PTQ} and FP32 / INT8 > 1 where FP32 / ORT PTQ > 1. "
           "cos vs FP32: mean centered cosine of the scores with FP32's on 16 other images ("
           + " / ".join(n for n in names if n != "fp32") + ")."]
    return md


if __name__ == "__main__":
    sys.exit(main())

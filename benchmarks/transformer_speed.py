"""INT8 vs FP32 sentence-encoder engines on ONNX Runtime's CPU provider, side by side.

all-MiniLM-L6-v2 is PTQ-calibrated (quick: ``--calib-sentences`` corpus sentences, method
``--method``), exported as FP32 and INT8 (TensorRT-style Q/DQ) ONNX with
``trtqat.families.encoder.onnx_export.export_encoder`` (``--exporter legacy``: the TorchScript
exporter under ``export_mode.enabled()``), and built into ORT engines: FP32 plain, INT8
with the ``qdq`` prepare step (``trtqat.engines.ort_qdq``: integer MatMul kernels, fused
epilogues; its agreement check is the mean embedding cosine vs the Q/DQ ONNX). For
reference, ORT's own ``quantize_dynamic`` of the FP32 ONNX is built and timed as well.

Checks: embedding cosine of each engine vs the FP32 engine on held-out sentences. Speed:
batch sizes ``--batch-sizes`` at sequence ``--seq-len`` on full-length rows (real text,
attention mask all ones), engines run interleaved (rotating order per round) after a
warm-up, medians reported with the FP32/INT8 ratio (target >= 1.5x). Results go to
``runs/transformer_speed/<time>/results.json``.

    python benchmarks/transformer_speed.py                 # threads: 2 if idle, else 1
    python benchmarks/transformer_speed.py --threads 1 --rounds 5 --method max
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench

from _bench import choose_threads, interleaved, save_results  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET = 1.5


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated (default 1,32)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=None,
                   help="ORT intra-op threads (default: 2 when the 1-minute load is < 0.5 per "
                   "core, else 1)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds per batch size (default 30 at batch 1, 6 above)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up runs per engine")
    p.add_argument("--method", default="max", help="calibration: max (quick) or mse, ...")
    p.add_argument("--calib-sentences", type=int, default=64)
    p.add_argument("--check-sentences", type=int, default=64, help="held-out cosine check")
    p.add_argument("--exporter", default="auto", choices=["auto", "export_encoder", "legacy"])
    p.add_argument("--no-ort-dynamic", action="store_true", help="skip quantize_dynamic")
    p.add_argument("--out", default="runs/transformer_speed", help="results folder")
    return p.parse_args(argv)


def _export(model, tok, q, folder: Path, sentences: list[str], exporter: str) -> tuple[dict, str]:
    """FP32 and INT8 ONNX of the encoder; returns ({variant: path}, exporter used)."""
    paths = {"fp32": folder / "minilm_fp32.onnx", "int8": folder / "minilm_int8.onnx"}
    if exporter in ("auto", "export_encoder"):
        try:
            from trtqat.families.encoder.onnx_export import export_encoder
        except ImportError:
            if exporter == "export_encoder":
                raise
        else:
            export_encoder(q, tok, paths["int8"], "int8", sentences=sentences[:8])
            export_encoder(model, tok, paths["fp32"], "fp32", sentences=sentences[:8])
            return paths, "export_encoder"
    import torch

    from trtqat.families.encoder.export import (
        OUTPUT_NAMES,
        encoder_dynamic_axes,
        example_inputs_for_encoder,
    )
    from trtqat.quant import export_mode

    ex = example_inputs_for_encoder(tok, 2, 16, sentences)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for variant, m in (("int8", q), ("fp32", model)):
            tmp = paths[variant].with_suffix(".tmp.onnx")
            with export_mode.enabled() if variant == "int8" else nullcontext(), torch.no_grad():
                torch.onnx.export(m, tuple(ex.values()), str(tmp), input_names=list(ex),
                                  output_names=list(OUTPUT_NAMES), opset_version=17,
                                  dynamic_axes=encoder_dynamic_axes(ex), dynamo=False)
            os.replace(tmp, paths[variant])
    return paths, "legacy (TorchScript, export_mode)"


def _full_rows(tok, sentences: list[str], batch: int, seq_len: int) -> dict[str, np.ndarray]:
    """``batch`` rows of real text filling all ``seq_len`` tokens (mask all ones)."""
    from trtqat.families.encoder.minilm import tokenize

    text = " ".join(sentences)
    rows = [text[i * 97:] + " " + text for i in range(batch)]  # distinct starts
    enc = tokenize(tok, rows, max_length=seq_len, padding="max_length")
    return {k: v.numpy() for k, v in enc.items()}


def _cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    return ",".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
                    if f in flags) or "-"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    import onnx
    import onnxruntime
    import torch

    from trtqat.arrays import row_cosines
    from trtqat.engines import build_engine
    from trtqat.engines.ort_qdq import count_compute_nodes
    from trtqat.engines.ort_u8s8 import reencode_report
    from trtqat.families.encoder import (
        CalibOptions,
        calibrated_copy,
        load_corpus,
        load_encoder,
    )
    from trtqat.families.encoder.minilm import tokenize

    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    out_dir = Path(args.out) / f"{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model, tok = load_encoder("minilm")
    model.eval()
    corpus = load_corpus()
    calib = list(corpus.train[:args.calib_sentences])
    q = calibrated_copy(model, tok, calib, CalibOptions(
        method=args.method, num_sentences=len(calib), max_length=args.seq_len))
    q.eval()
    paths, exporter = _export(model, tok, q, out_dir, calib, args.exporter)
    print(f"calibrated ({args.method}, {len(calib)} sentences) and exported ({exporter}) in "
          f"{time.perf_counter() - started:.0f} s")
    calib_feeds = tuple(dict(tokenize(tok, calib[i:i + 16], max_length=args.seq_len).items())
                        for i in range(0, len(calib), 16))
    calib_feeds = tuple({k: v.numpy() for k, v in f.items()} for f in calib_feeds)

    engines = {"fp32": build_engine(paths["fp32"], "ort", threads=threads, ort_prepare="none")}
    t0 = time.perf_counter()
    engines["int8"] = build_engine(paths["int8"], "ort", threads=threads, ort_prepare="qdq",
                                   calib_feeds=calib_feeds)
    int8_build_s = time.perf_counter() - t0
    int8_model = onnx.load_from_string(engines["int8"].payload)
    report = reencode_report(int8_model)
    if not args.no_ort_dynamic:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # "please consider pre-processing" warnings
        with tempfile.TemporaryDirectory() as tmp:
            dyn = Path(tmp) / "dyn.onnx"
            try:
                quantize_dynamic(str(paths["fp32"]), str(dyn), weight_type=QuantType.QInt8)
            finally:
                root.setLevel(level)
            engines["ort quantize_dynamic"] = build_engine(dyn, "ort", threads=threads,
                                                           ort_prepare="none")
    runners = {name: e.runner(threads=threads) for name, e in engines.items()}
    for r in runners.values():
        r.__enter__()
    results: dict[str, Any] = {"batches": {}}
    try:
        held = list(corpus.heldout[:args.check_sentences])
        feed = {k: v.numpy() for k, v in tokenize(tok, held, max_length=args.seq_len).items()}
        outs = {n: next(iter(r.infer(feed).values())) for n, r in runners.items()}
        cos = {n: row_cosines(outs["fp32"], o) for n, o in outs.items() if n != "fp32"}
        results["cosine_vs_fp32"] = {n: {"mean": float(c.mean()), "min": float(c.min())}
                                     for n, c in cos.items()}
        for batch in [int(b) for b in args.batch_sizes.split(",") if b.strip()]:
            rounds = args.rounds or (30 if batch == 1 else 6)
            feed = _full_rows(tok, list(corpus.heldout[:64]), batch, args.seq_len)
            times = interleaved(runners, feed, rounds, args.warmup)
            med = {n: float(np.median(t)) for n, t in times.items()}
            results["batches"][batch] = {"median_ms": med, "rounds": rounds, "times_ms": times}
    finally:
        for r in runners.values():
            r.__exit__(None, None, None)
    counts = count_compute_nodes(int8_model)
    results.update(config={
        "model": "all-MiniLM-L6-v2", "seq_len": args.seq_len, "threads": threads,
        "threads_reason": why, "calibration": f"{args.method}, {len(calib)} sentences",
        "exporter": exporter, "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
        "machine": platform.machine(), "cpus": os.cpu_count(), "cpu_flags": _cpu_flags(),
        "load_avg": os.getloadavg(), "int8_build_s": round(int8_build_s, 1),
        "rows": "full-length real text, attention mask all ones"},
        int8_compute_nodes=counts, int8_reencode=report)
    _print(results)
    save_results(out_dir, results)
    return results


def _print(results: dict[str, Any]) -> None:
    cfg = results["config"]
    print(f"\n{cfg['model']}, sequence {cfg['seq_len']}, ORT {cfg['onnxruntime']} CPU provider, "
          f"{cfg['threads']} thread(s) ({cfg['threads_reason']}), CPU {cfg['cpu_flags']}, "
          f"{cfg['cpus']} cores, exporter {cfg['exporter']}, calibration {cfg['calibration']}")
    names = list(next(iter(results["batches"].values()))["median_ms"])
    head = f"{'batch':>5}  " + "  ".join(f"{n:>22}" for n in names) + "  FP32/INT8"
    print(head + f"  (target >= {TARGET}x)\n" + "-" * len(head))
    for batch, r in results["batches"].items():
        med = r["median_ms"]
        cells = [f"{med[n]:8.2f} ms {1000 * batch / med[n]:7.1f}/s" for n in names]
        ratio = med["fp32"] / med["int8"]
        r["fp32_over_int8"] = ratio
        print(f"{batch:>5}  " + "  ".join(f"{c:>22}" for c in cells) +
              f"  {ratio:6.2f}x {'PASS' if ratio >= TARGET else 'FAIL'}")
    print("(median latency over interleaved rounds, sequences per second)")
    for name, c in results["cosine_vs_fp32"].items():
        print(f"embedding cosine vs FP32 engine, {name}: mean {c['mean']:.4f}, min {c['min']:.4f}")
    n = results["int8_compute_nodes"]
    print(f"INT8 engine: integer {n['integer_total']} ({n['integer']}), float {n['float_total']} "
          f"({n['float']}), Q/DQ {n['quantize_dequantize']}")
    agreement = results["int8_reencode"].get("agreement", {})
    if agreement:
        print(f"INT8 re-encoding vs its Q/DQ ONNX: mean cosine {agreement.get('mean_cosine', 0):.5f}"
              f" (min {agreement.get('min_cosine', 0):.5f}) on {agreement.get('samples')} rows")


if __name__ == "__main__":
    main()

"""all-MiniLM-L6-v2 with INT4 block-wise weights (W4A16, format int4): PTQ (max and mse block
amax) and QAT (self-distillation, learned block amax) mean cosine against FP32 on held-out
sentences, then the int4 / int4-fp16 / fp16 ONNX files (sizes, and each file's check
against PyTorch). Short by default (2 CPU cores): a few hundred sentences, few QAT steps.

    python benchmarks/int4_minilm.py [--block-size 32] [--qat-steps 60] [--embeddings]
                                     [--awq] [--json out.json]

``--embeddings`` also makes the embedding tables INT4 (``to_int4_weights(embeddings=True)``):
format int4 quantizes Linear weights only, and half of MiniLM's parameters are its word
embedding table, which then stays float in the file. ``--awq`` adds PTQ rows with
activation-aware scaling (:mod:`trtqat.quant.awq`) before the max / mse block amax.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from trtqat.families.encoder.corpus import load_corpus  # noqa: E402
from trtqat.families.encoder.metrics import mean_cosine  # noqa: E402
from trtqat.families.encoder.minilm import batches, embed, load_encoder  # noqa: E402
from trtqat.families.encoder.onnx_export import EncoderExporter  # noqa: E402
from trtqat.families.encoder.recipes import (  # noqa: E402
    EncoderQATConfig,
    collect_encoder_stats,
    qat_encoder,
    quantized_copy,
    set_amax,
)
from trtqat.quant.awq import apply_awq  # noqa: E402
from trtqat.quant.blockwise import to_int4_weights  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--calib-sentences", type=int, default=64)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--train-sentences", type=int, default=320)
    p.add_argument("--qat-steps", type=int, default=60)
    p.add_argument("--qat-batch-size", type=int, default=16)
    p.add_argument("--qat-lr", type=float, default=2e-5)
    p.add_argument("--qat-amax-lr", type=float, default=1e-3)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--embeddings", action="store_true", help="INT4 embedding tables too")
    p.add_argument("--awq", action="store_true", help="also PTQ with AWQ-style scaling")
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model, tok = load_encoder("minilm")
    corpus = load_corpus("builtin", heldout=args.heldout, max_heldout=args.heldout)
    calib = list(corpus.train[:args.calib_sentences])
    train = list(corpus.train[args.calib_sentences:args.calib_sentences + args.train_sentences])
    held = list(corpus.heldout)
    ref = embed(model, tok, held, max_length=args.max_length)
    out: dict = {"block_size": args.block_size, "embeddings": args.embeddings,
                 "heldout": len(held), "train": len(train),
                 "torch_threads": torch.get_num_threads()}

    ptq = {}
    runs = [(m, False) for m in ("max", "mse")] + ([(m, True) for m in ("max", "mse")]
                                                    if args.awq else [])
    for method, awq in runs:
        label = f"awq-{method}" if awq else method
        q = quantized_copy(model)
        n = to_int4_weights(q, args.block_size, embeddings=args.embeddings)
        if awq:
            apply_awq(q, lambda m, b: m(**b), batches(tok, calib, 32, args.max_length))
        collect_encoder_stats(q, tok, calib, 32, args.max_length)
        set_amax(q, method)
        ptq[label] = q
        out[f"ptq_{label}_cosine"] = mean_cosine(ref, embed(q, tok, held,
                                                             max_length=args.max_length))
        print(f"PTQ {label:7s} int4 block {args.block_size} ({n} INT4 weights): mean cosine "
              f"vs FP32 {out[f'ptq_{label}_cosine']:.5f}", flush=True)
    start = max(ptq, key=lambda m: out[f"ptq_{m}_cosine"])
    student = copy.deepcopy(ptq[start])
    cfg = EncoderQATConfig(epochs=100, max_steps=args.qat_steps,
                           batch_size=args.qat_batch_size, max_length=args.max_length,
                           lr=args.qat_lr, amax_lr=args.qat_amax_lr)
    t0 = time.perf_counter()
    hist = qat_encoder(student, model, tok, train, cfg)
    out["qat_start"] = start
    out["qat_steps"] = hist["steps"]
    out["qat_s"] = round(time.perf_counter() - t0, 1)
    out["qat_cosine"] = mean_cosine(ref, embed(student, tok, held, max_length=args.max_length))
    print(f"QAT (from PTQ {start}, {hist['steps']} steps, {out['qat_s']} s): mean cosine vs "
          f"FP32 {out['qat_cosine']:.5f}; loss {hist['loss'][0]:.5f} -> "
          f"{hist['loss'][-1]:.5f}", flush=True)

    if not args.no_export:
        tmp = tempfile.TemporaryDirectory(prefix="int4_minilm_")
        folder = tmp.name
        exporter = EncoderExporter(student, tok, sentences=held[:32])
        for variant in ("fp16", "int4-fp16", "int4"):
            path = os.path.join(folder, f"minilm-{variant}.onnx")
            result = exporter.export(path, variant, 21)
            out[f"{variant}_bytes"] = os.path.getsize(path)
            out[f"{variant}_checks"] = [f"{c.name}: {'ok' if c.passed else 'FAIL'} {c.detail}"
                                        for c in result.checks]
            print(f"{variant:9s} {out[f'{variant}_bytes'] / 1e6:7.2f} MB", flush=True)
            for line in out[f"{variant}_checks"]:
                print(f"    {line}")
        for variant in ("int4-fp16", "int4"):
            out[f"fp16_over_{variant}"] = out["fp16_bytes"] / out[f"{variant}_bytes"]
            print(f"fp16 file / {variant} file: {out[f'fp16_over_{variant}']:.2f}x")
        tmp.cleanup()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])

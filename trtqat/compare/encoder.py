"""``compare`` for sentence encoders: held-out sentences, embedding fidelity, seq-len timing.

Every engine embeds the corpus' held-out sentences (the split the ``calibrate``/``qat``
runs evaluated on, never calibrated or trained on); its embeddings are scored against the
FP32 PyTorch model's (mean cosine, Spearman correlation of the pairwise similarities).
Latency (first batch size) and throughput (last) are measured on real sentences padded to
exactly ``--seq-len`` tokens, the fixed-shape setting of BERT benchmarks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.compare.timing import Timed
from trtqat.compare.variants import CompareError, Variant
from trtqat.errors import TrtqatError

log = logging.getLogger(__name__)

ARCH_KEY = "trtqat.arch"  # ONNX metadata: the encoder an exported file came from
CALIB_BATCHES = 4


@dataclass
class EncoderData:
    """What every encoder variant is measured on."""

    sentences: list[str]  # held-out
    ref: np.ndarray  # FP32 PyTorch embeddings of ``sentences``
    batches: list[dict[str, np.ndarray]]  # tokenized ``sentences`` (max length ``seq_len``)
    calib: list[dict[str, np.ndarray]]  # tokenized training sentences (ORT int8 re-encoding)
    tokenizer: Any
    seq_len: int
    info: dict[str, Any] = field(default_factory=dict)


def _numpy(enc: dict) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v.numpy()) for k, v in enc.items()}


def _onnx_arch(path: Path) -> str | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in model.metadata_props if p.key == ARCH_KEY), None)


def _reference(variants: list[Variant], model: str | None):
    """``(FP32 encoder, tokenizer, description)``: the fp32 checkpoint, else ``model``."""
    from trtqat.train.checkpoint import load_checkpoint
    from trtqat.transformers.checkpoint import build_encoder_from_checkpoint
    from trtqat.transformers.minilm import MINILM, load_encoder

    ckpts = list(dict.fromkeys(v.checkpoint for v in variants if v.checkpoint is not None))
    arch = None
    for path in ckpts:  # the FP32 run first (report order), then the one a PTQ/QAT run names
        ckpt = load_checkpoint(path)
        arch = arch or ckpt["model"]["arch"]
        if ckpt.get("stage") == "fp32":
            return (*build_encoder_from_checkpoint(ckpt, quantized=False), str(path))
        ref = ckpt.get("fp32_checkpoint")
        if ref and Path(ref).is_file():
            return (*build_encoder_from_checkpoint(load_checkpoint(ref), quantized=False),
                    str(ref))
        if ckpt.get("stage") == "ptq":  # PTQ weights in float are the FP32 ones
            return (*build_encoder_from_checkpoint(ckpt, quantized=False),
                    f"{path} (weights in float)")
    arch = model or arch or next(
        (a for a in (_onnx_arch(v.onnx) for v in variants if v.onnx) if a), None) or MINILM
    encoder, tokenizer = load_encoder(arch)
    return encoder, tokenizer, f"pretrained:{arch}"


def load_encoder_data(variants: list[Variant], settings: dict[str, Any], cfg) -> EncoderData:
    """Held-out sentences, their FP32 embeddings, and tokenized batches for ``variants``."""
    from trtqat.transformers.corpus import load_corpus
    from trtqat.transformers.minilm import embed, tokenize
    from trtqat.transformers.runs import SPLIT_SEED, _check_data

    data = _check_data(cfg.data or settings.get("data"))
    corpus = load_corpus(data, seed=SPLIT_SEED)
    sentences = list(corpus.heldout[:cfg.num_sentences])
    if len(sentences) < 3:
        raise CompareError(f"the held-out split of --data {data} has {len(sentences)} "
                           "sentence(s); embedding fidelity needs at least 3: use more data")
    model, tok, ref_src = _reference(variants, cfg.model)
    limit = getattr(getattr(model.backbone, "config", None), "max_position_embeddings", None)
    if limit and cfg.seq_len > limit:
        raise CompareError(f"--seq-len {cfg.seq_len} exceeds the encoder's "
                           f"{limit} positions: lower --seq-len")
    big = max(cfg.batch_sizes)
    ref = embed(model, tok, sentences, big, cfg.seq_len).numpy()
    batches = [_numpy(tokenize(tok, sentences[i:i + big], cfg.seq_len))
               for i in range(0, len(sentences), big)]
    train = list(corpus.train)
    calib = [_numpy(tokenize(tok, train[i:i + big], cfg.seq_len))
             for i in range(0, min(len(train), CALIB_BATCHES * big), big)]
    info = {"data": data, "corpus": corpus.source, "heldout_sentences": len(sentences),
            "seq_len": cfg.seq_len, "reference": ref_src, "family": "transformer",
            "metric": "embedding fidelity vs FP32 PyTorch (mean cosine, Spearman)"}
    return EncoderData(sentences, ref, batches, calib, tok, cfg.seq_len, info)


def _export(variant: Variant, path: Path, data: EncoderData, validate: bool = True) -> None:
    from trtqat.train.checkpoint import load_checkpoint
    from trtqat.transformers.checkpoint import build_encoder_from_checkpoint
    from trtqat.transformers.onnx_export import export_encoder

    ckpt = load_checkpoint(variant.checkpoint)
    quantized = variant.export_variant in ("int8", "int8-fp16")
    model, tok = build_encoder_from_checkpoint(ckpt, quantized=quantized)
    export_encoder(model, tok, path, variant=variant.export_variant,
                   sentences=data.sentences[:8], validate=validate,
                   metadata={ARCH_KEY: str(ckpt["model"]["arch"]), "trtqat.stage":
                             str(ckpt.get("stage"))})


def _build(variant: Variant, onnx_path: Path, engine_path: Path, cfg, data: EncoderData,
           names: list[str], notes: list[str]):
    from trtqat.engines import build_engine, load_engine

    if (engine_path.is_file() and not cfg.fresh
            and engine_path.stat().st_mtime >= onnx_path.stat().st_mtime):
        return load_engine(engine_path)
    big = max(cfg.batch_sizes)
    kwargs: dict[str, Any] = {
        "min_shapes": {n: (1, 1) for n in names},
        "opt_shapes": {n: (big, cfg.seq_len) for n in names},
        "max_shapes": {n: (big, cfg.seq_len) for n in names},
        "threads": cfg.threads,
    }
    if cfg.backend == "ort" and variant.precision.startswith("int8"):
        feeds = [{n: f[n] for n in names} for f in data.calib]
        try:
            engine = build_engine(onnx_path, "ort", ort_prepare="qdq", calib_feeds=feeds,
                                  **kwargs)
        except TrtqatError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("%s: the integer re-encoding failed (%s); built as exported", variant.name,
                        first)
            notes.append(f"ORT int8 re-encoding failed, Q/DQ run as exported: {first[:160]}")
            engine = build_engine(onnx_path, "ort", ort_prepare="none", **kwargs)
    else:
        engine = build_engine(onnx_path, cfg.backend, **kwargs)
    engine.save(engine_path)
    return engine


def _fidelity(runner, data: EncoderData, names: list[str]) -> dict[str, float | None]:
    from trtqat.transformers.metrics import embedding_fidelity

    outs = []
    for batch in data.batches:
        result = runner.infer({n: batch[n] for n in names})
        out = result.get("sentence_embedding")
        outs.append((out if out is not None else next(iter(result.values()))).astype(np.float32))
    got = np.concatenate(outs)
    if got.shape != data.ref.shape:
        raise CompareError(f"the engine returns {got.shape} embeddings for {data.ref.shape} "
                           "expected: is it an export of this encoder?")
    fid = embedding_fidelity(data.ref, got)
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else float(v))
            for k, v in fid.items()}


def _feed(data: EncoderData, batch: int, names: list[str]) -> dict[str, np.ndarray]:
    from trtqat.transformers.minilm import tokenize

    sentences = (data.sentences * (batch // len(data.sentences) + 1))[:batch]
    enc = _numpy(tokenize(data.tokenizer, sentences, data.seq_len, padding="max_length"))
    return {n: enc[n] for n in names}


def measure_encoder_variant(variant: Variant, cfg, data: EncoderData) -> Timed:
    """Export (if needed), build (if needed), then measure the fidelity of one encoder; its
    speed is measured later, interleaved with the other variants."""
    from trtqat.compare.run import finish_variant, start_variant
    from trtqat.engines.onnx_io import load_onnx, onnx_input_specs

    result, onnx_path, engine_path = start_variant(
        variant, cfg, lambda p, check: _export(variant, p, data, check))
    names = [s.name for s in onnx_input_specs(load_onnx(onnx_path))]
    missing = [n for n in names if n not in data.batches[0]]
    if missing:
        raise CompareError(f"{onnx_path} wants input '{missing[0]}', which the tokenizer does "
                           "not make: is it an export of this encoder?")
    engine = _build(variant, onnx_path, engine_path, cfg, data, names, result.notes)
    runner_kwargs = finish_variant(result, engine, cfg)
    with engine.runner(**runner_kwargs) as runner:
        result.metrics = _fidelity(runner, data, names)
    return Timed(result, engine, runner_kwargs,
                 {b: _feed(data, b, names) for b in cfg.batch_sizes})

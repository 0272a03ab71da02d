"""``compare`` data of sentence encoders: held-out sentences, embedding fidelity.

Every engine embeds the corpus' held-out sentences (the split the ``calibrate``/``qat``
runs evaluated on, never calibrated or trained on); its embeddings are scored against the
FP32 PyTorch model's (mean cosine, Spearman correlation of the pairwise similarities).
Latency (first batch size) and throughput (last) are measured on real sentences padded to
exactly ``--max-length`` tokens, the fixed-shape setting of BERT benchmarks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtqat.families.types import CompareError, EvalData, Variant

ARCH_KEY = "trtqat.arch"  # ONNX metadata: the encoder an exported file came from
CALIB_BATCHES = 4


def _numpy(enc: dict) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v.numpy()) for k, v in enc.items()}


def _onnx_arch(path: Path) -> str | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in model.metadata_props if p.key == ARCH_KEY), None)


def _reference(family, variants: list[Variant], model: str | None):
    """``(FP32 encoder, tokenizer, description)``: the fp32 checkpoint, else ``model``."""
    from trtqat.families.encoder.minilm import MINILM, load_encoder, load_tokenizer
    from trtqat.runs.checkpoint import load_checkpoint

    def float_model(ckpt):
        return family.load(ckpt, quantized=False), load_tokenizer(ckpt["model"]["arch"])

    ckpts = list(dict.fromkeys(v.checkpoint for v in variants if v.checkpoint is not None))
    arch = None
    for path in ckpts:  # the FP32 run first (report order), then the one a PTQ/QAT run names
        ckpt = load_checkpoint(path)
        arch = arch or ckpt["model"]["arch"]
        if ckpt.get("stage") == "fp32":
            return (*float_model(ckpt), str(path))
        ref = ckpt.get("fp32_checkpoint")
        if ref and Path(ref).is_file():
            return (*float_model(load_checkpoint(ref)),
                    str(ref))
        if ckpt.get("stage") == "ptq":  # PTQ weights in float are the FP32 ones
            return (*float_model(ckpt),
                    f"{path} (weights in float)")
    arch = model or arch or next(
        (a for a in (_onnx_arch(v.onnx) for v in variants if v.onnx) if a), None) or MINILM
    encoder, tokenizer = load_encoder(arch)
    return encoder, tokenizer, f"pretrained:{arch}"


def sentence_data(family, variants: list[Variant], settings: dict[str, Any], cfg) -> EvalData:
    """Held-out sentences, their FP32 embeddings, and tokenized batches for ``variants``."""
    from trtqat.families.encoder.corpus import load_corpus
    from trtqat.families.encoder.minilm import embed, tokenize
    from trtqat.families.encoder.runs import SPLIT_SEED, _check_data

    data = _check_data(cfg.data or settings.get("data"))
    corpus = load_corpus(data, seed=SPLIT_SEED)
    sentences = list(corpus.heldout[:cfg.num_sentences])
    if len(sentences) < 3:
        raise CompareError(f"the held-out split of --data {data} has {len(sentences)} "
                           "sentence(s); embedding fidelity needs at least 3: use more data")
    model, tok, ref_src = _reference(family, variants, cfg.model)
    length = cfg.max_length
    limit = getattr(getattr(model.backbone, "config", None), "max_position_embeddings", None)
    if limit and length > limit:
        raise CompareError(f"--max-length {length} exceeds the encoder's "
                           f"{limit} positions: lower --max-length")
    big = max(cfg.batch_sizes)
    ref = embed(model, tok, sentences, big, length).numpy()
    batches = [_numpy(tokenize(tok, sentences[i:i + big], length))
               for i in range(0, len(sentences), big)]
    train = list(corpus.train)
    calib = [_numpy(tokenize(tok, train[i:i + big], length))
             for i in range(0, min(len(train), CALIB_BATCHES * big), big)]

    def timing(batch: int) -> dict[str, np.ndarray]:
        rows = (sentences * (batch // len(sentences) + 1))[:batch]
        return _numpy(tokenize(tok, rows, length, padding="max_length"))

    def export(variant: Variant, path: Path, validate: bool) -> None:
        from trtqat.families.encoder.onnx_export import export_encoder
        from trtqat.runs.checkpoint import load_checkpoint

        ckpt = load_checkpoint(variant.checkpoint)
        export_encoder(family.load_variant(variant), tok, path, variant=variant.export_variant,
                       sentences=sentences[:8], validate=validate,
                       metadata={ARCH_KEY: str(ckpt["model"]["arch"]),
                                 "trtqat.stage": str(ckpt.get("stage"))})

    info = {"data": data, "corpus": corpus.source, "heldout_sentences": len(sentences),
            "max_length": length, "reference": ref_src, "family": family.name,
            "metric": "embedding fidelity vs FP32 PyTorch (mean cosine, Spearman)"}
    return EvalData(batches, ref, calib, timing, ((1,), (length,)), "mean_cosine", export,
                    info, output="sentence_embedding")

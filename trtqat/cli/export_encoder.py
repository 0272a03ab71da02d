"""``trtqat export`` of an encoder checkpoint (``model.family == "transformer"``).

Each requested variant goes through :class:`trtqat.transformers.onnx_export.EncoderExporter`
(batch and sequence dynamic, validated with ONNX Runtime at two shapes, linted for int8);
the per-check lines and ``export.json`` are those of the CNN path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Validation sentences when --data is not given: varied lengths, so that both traced
# shapes hold real tokens and padding.
DEFAULT_SENTENCES = (
    "A quantized encoder runs its matrix products in eight bit integers.",
    "The engine is built once and then benchmarked on the same inputs.",
    "Sentence embeddings of the student stay close to those of the teacher.",
    "Return a new list containing every item of the sequence.",
    "Short one.",
    "If the file does not exist, an error is raised.",
)
MAX_VALIDATION_SENTENCES = 16
# CNN-only options: (attribute, its default, flag)
_CNN_ONLY = (("image_size", None, "--image-size"), ("batch", None, "--batch"),
             ("io_dtype", "fp32", "--io-dtype"), ("val_batches", None, "--val-batches"),
             ("no_fold_bn", False, "--no-fold-bn"))


def _reject_cnn_options(args) -> None:
    from trtqat.export import ExportError

    given = [flag for attr, default, flag in _CNN_ONLY
             if getattr(args, attr, default) not in (default, None, (), [])]
    if getattr(args, "skip_layers", None):
        given.append("--skip-layers")
    if given:
        verb = "is" if len(given) == 1 else "are"
        raise ExportError(f"{', '.join(given)} {verb} for CNN checkpoints only; "
                          f"{args.checkpoint} is a sentence encoder (batch and sequence are "
                          "always dynamic; use --seq-len for the traced example length, and "
                          "set skip layers when calibrating)")


def _sentences(data: str | None) -> list[str]:
    if not data:
        return list(DEFAULT_SENTENCES)
    from trtqat.transformers.corpus import load_corpus

    corpus = load_corpus(data)
    return list(corpus.heldout[:MAX_VALIDATION_SENTENCES])


def _arch_name(arch: str) -> str:
    from trtqat.transformers.minilm import MINILM

    return MINILM if arch == MINILM else (Path(arch).name or "encoder")


def run_encoder(args, ckpt: dict[str, Any]) -> int:
    """Export every requested variant of an encoder checkpoint; exit 1 if any failed."""
    from trtqat.cli.cmd_export import export_variants
    from trtqat.export import ExportError, artifact_name
    from trtqat.export.naming import INT8_VARIANTS, expand_variants
    from trtqat.export.onnx_export import check_writable
    from trtqat.transformers.checkpoint import build_encoder_from_checkpoint
    from trtqat.transformers.onnx_export import EncoderExporter, _max_positions

    _reject_cnn_options(args)
    variants = expand_variants(args.variant)
    spec, stage = ckpt["model"], str(ckpt.get("stage", "fp32"))
    if any(v in INT8_VARIANTS for v in variants) and not spec.get("quantized"):
        raise ExportError(
            f"{args.checkpoint} is a {stage} encoder checkpoint without quantizer state, so it "
            "has no INT8 form: run `trtqat calibrate --model ...` or `trtqat qat` first, or "
            "export --variant fp32/fp16")
    out = check_writable(args.out)
    model, tokenizer = build_encoder_from_checkpoint(ckpt)
    if any(v in INT8_VARIANTS for v in variants):
        from trtqat.export.calibrated import refuse_uncalibrated

        refuse_uncalibrated(model)  # before any file is written
    limit = _max_positions(model) or 512
    seq_len = getattr(args, "seq_len", None) or min(int(spec.get("max_length") or 128), limit)
    if not 2 <= seq_len <= limit:
        raise ExportError(f"--seq-len {seq_len} is out of range: the encoder takes 2 to "
                          f"{limit} tokens")
    shapes = ((2, seq_len), (3, 9 if seq_len != 9 else 7))
    sentences = _sentences(getattr(args, "data", None))
    exporter = EncoderExporter(model, tokenizer, sentences=sentences, shapes=shapes,
                               seq_len=seq_len)
    arch = _arch_name(str(spec["arch"]))
    metadata = {"trtqat.arch": arch, "trtqat.stage": stage,
                "trtqat.max_length": str(spec.get("max_length", seq_len))}
    return export_variants(
        args, out, variants, lambda v: out / artifact_name(arch, stage, v, None),
        lambda path, v: exporter.export(path, v, args.opset, validate=not args.no_validate,
                                        metadata=metadata),
        "dynamic batch and sequence",
        {"family": "transformer", "batch": "dynamic", "sequence": "dynamic", "seq_len": seq_len})

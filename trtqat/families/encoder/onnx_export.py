"""``export_encoder``: a :class:`SentenceEncoder` to a checked FP32 / FP16 / INT8 / INT8-FP16 ONNX.

The encoder goes through the one exporter, :class:`trtqat.export.onnx_export.Exporter`;
:func:`encoder_plan` says what is particular to it: the dynamo export with the batch and
sequence axes of every input dynamic (``trtqat.families.encoder.export`` names them), no
BatchNorm folding, float constants clipped to fp16's range for fp16 variants (the attention
mask's fill value), and validation on real tokenized sentences at each ``(batch,
sequence)`` of ``shapes`` (two different ones prove both axes are dynamic) by embedding
cosine (:func:`trtqat.export.checks.embedding_checks`, thresholds in the variants table).
Quantizers default to the full range [-128, 127], what ONNX QuantizeLinear and TensorRT's Q
compute, so the Q/DQ file and the PyTorch fake-quant model agree up to float rounding
(measured on all-MiniLM-L6-v2 PTQ: see :mod:`trtqat.variants`; the tiny test BERT
gives 1 - 1e-6).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from trtqat.export.checks import MIN_COSINE, MIN_MEAN_COSINE, embedding_checks, fidelity_check
from trtqat.export.errors import ExportError
from trtqat.export.onnx_export import Exporter, ExportPlan
from trtqat.export.result import ExportResult
from trtqat.families.encoder.checkpoint import TASK
from trtqat.families.encoder.export import (
    OUTPUT_NAMES,
    encoder_dynamic_shapes,
    encoder_input_names,
    example_inputs_for_encoder,
)
from trtqat.variants import arch_label

DEFAULT_SHAPES = ((2, 16), (3, 9))


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence the encoder takes (its position embeddings), if it says; less
    the positions up to the padding index where they count from it (RoBERTa: 2)."""
    backbone = getattr(model, "backbone", model)
    value = getattr(getattr(backbone, "config", None), "max_position_embeddings", None)
    if not value:
        return None
    table = getattr(getattr(backbone, "embeddings", None), "position_embeddings", None)
    pad = getattr(table, "padding_idx", None)
    return int(value) - (int(pad) + 1 if isinstance(table, nn.Embedding) and pad is not None
                         else 0)


def check_shapes(shapes: Sequence[tuple[int, int]], limit: int | None) -> list[tuple[int, int]]:
    """``(batch, sequence)`` validation shapes, checked against the encoder's positions."""
    out = [(int(b), int(n)) for b, n in shapes]
    if not out:
        raise ExportError("shapes is empty: give at least one (batch, sequence) to validate at")
    for b, n in out:
        if b < 1 or n < 2:
            raise ExportError(f"validation shape ({b}, {n}) needs batch >= 1 and sequence >= 2")
        if limit is not None and n > limit:
            raise ExportError(f"sequence length {n} exceeds the encoder's "
                              f"{limit} positions: use --max-length <= {limit}")
    return out


def encoder_plan(model: nn.Module, tokenizer, *, sentences: Sequence[str] | None = None,
                 shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
                 max_length: int | None = None) -> ExportPlan:
    """The export plan of an encoder; ``max_length`` is the traced example's sequence length
    (the file stays dynamic; default: the first shape's)."""
    limit = max_positions(model)
    shapes = check_shapes(shapes, limit)
    trace_len = max_length or max(shapes[0][1], 2)
    check_shapes([(2, trace_len)], limit)
    sentences = list(sentences or [])
    # torch.export specialises size-1 dimensions: trace with two rows
    inputs = example_inputs_for_encoder(tokenizer, 2, trace_len, sentences)
    validation = [tuple(example_inputs_for_encoder(tokenizer, b, n, sentences).values())
                  for b, n in shapes]
    return _plan(tuple(inputs.values()), list(inputs), validation, limit)


def _plan(inputs: tuple[torch.Tensor, ...], names: list[str], validation: list,
          limit: int | None) -> ExportPlan:
    """The encoder's plan: batch and sequence dynamic, validated on ``validation`` by
    embedding cosine, float constants clipped to fp16's range for fp16 variants."""
    dims = encoder_dynamic_shapes(names, max_sequence=limit)
    return ExportPlan(inputs, names, list(OUTPUT_NAMES),
                      dynamic_shapes=tuple(dims[n] for n in names), dynamic_batch=True,
                      dynamic_axes=("batch", "sequence"), validation=validation,
                      check_example=False, checks=embedding_checks, fold_bn=False,
                      clip_fp16=True,
                      metadata={"trtqat.task": TASK, "trtqat.inputs": ",".join(names),
                                "trtqat.outputs": ",".join(OUTPUT_NAMES)})


def module_plan(model: nn.Module, example_inputs: Any, *, dynamic_batch: bool = True,
                dynamic_axes: Sequence[str] | None = None, validation_data: Any = None,
                fold_bn: bool = True, checks: Any = embedding_checks) -> ExportPlan:
    """The plan of an in-memory encoder from a tokenizer's output (``{"input_ids": ...,
    "attention_mask": ..., ...}``, or a tuple in ``forward`` order, int64 ``(batch,
    sequence)``): batch and sequence dynamic, validated on the example, on its first rows
    cut to half the tokens (a second shape) and on ``validation_data`` (more tokenizer
    outputs). A :class:`SentenceEncoder` is checked by ``checks``; a Hugging Face encoder
    (``BertModel``, ``ViTModel``, ...) or other token model keeps its own output names and
    is checked by the cosine of every output (``hf_export.hf_plan``; its other inputs, such
    as ``pixel_values``, have a dynamic batch only). ``fold_bn`` does not apply."""
    from trtqat.export.inputs import named_inputs, validation_inputs
    from trtqat.families.encoder.hf_export import hf_plan, is_token_input
    from trtqat.families.encoder.minilm import SentenceEncoder

    sentence = isinstance(model, SentenceEncoder)
    inputs, names = named_inputs(model, example_inputs)
    tokens = [t for t in inputs if is_token_input(t)]
    if (sentence and len(tokens) != len(inputs)) or not (tokens or inputs[0].dim()):
        raise ExportError("an encoder's example_inputs are the tokenizer's int64 (batch, "
                          "sequence) tensors, e.g. tokenizer(sentences, return_tensors='pt')")
    fixed = [a for a in (dynamic_axes or ()) if a not in ("batch", "sequence")]
    if not dynamic_batch or fixed or (dynamic_axes is not None and tokens
                                      and set(dynamic_axes) != {"batch", "sequence"}):
        raise ExportError("an encoder is exported with batch and sequence dynamic: "
                          "drop dynamic_batch=False / dynamic_axes")
    batch = int(inputs[0].shape[0])
    length = int(tokens[0].shape[1]) if tokens else 2
    limit = max_positions(model)
    check_shapes([(batch, length)], limit)
    if batch == 1:  # torch.export specialises size-1 dimensions: trace with two rows
        inputs = tuple(torch.cat([t, t]) for t in inputs)
        batch = 2
    cut = max(2, length // 2)
    second = tuple(t[:max(1, batch - 1), :cut] if is_token_input(t) else t[:max(1, batch - 1)]
                   for t in inputs)
    validation = [inputs, *([second] if cut < length or not tokens else []),
                  *validation_inputs(model, validation_data)]
    if not sentence:
        return hf_plan(model, inputs, names, validation, limit)
    names = names or list(encoder_input_names())[:len(inputs)]
    plan = _plan(inputs, names, validation, limit)
    plan.checks = checks
    return plan


def EncoderExporter(model: nn.Module, tokenizer, *, sentences: Sequence[str] | None = None,  # noqa: N802
                    shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
                    max_length: int | None = None) -> Exporter:
    """The exporter of one encoder (several variants share its graphs and references)."""
    return Exporter(model, encoder_plan(model, tokenizer, sentences=sentences, shapes=shapes,
                                        max_length=max_length))


def export_encoder(model: nn.Module, tokenizer, path: str | os.PathLike, variant: str = "int8",
                   *, opset: int | None = None, sentences: Sequence[str] | None = None,
                   validate: bool = True, shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
                   metadata: dict[str, str] | None = None) -> ExportResult:
    """Export a :class:`SentenceEncoder` as one ONNX ``variant`` (fp32, fp16, int8, int8-fp16,
    fp8, fp8-fp16).

    Inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the tokenizer makes
    them), batch and sequence dynamic; output ``sentence_embedding``, batch dynamic. INT8
    variants need active calibrated quantizers (``quantize_transformer`` then calibration or
    QAT); float variants export with the quantizers disabled. Unless ``validate`` is False,
    ONNX Runtime is compared with PyTorch on ``sentences`` (or built-in ones) tokenized at
    each ``(batch, sequence)`` of ``shapes``, and INT8 files are linted; a failed check
    raises :class:`ValidationError` and keeps no file. ``metadata`` is added to the file's
    metadata (next to ``trtqat.variant``, ``trtqat.task``, ...). Returns the ExportResult.
    """
    exporter = EncoderExporter(model, tokenizer, sentences=sentences, shapes=shapes)
    return exporter.export(path, variant, opset, validate=validate, metadata=metadata)


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
# image-only options of `trtqat export`: (attribute, its default, flag)
_IMAGE_ONLY = (("image_size", None, "--image-size"), ("batch", None, "--batch"),
               ("dynamic", None, "--dynamic"), ("io_dtype", "fp32", "--io-dtype"),
               ("val_batches", None, "--val-batches"), ("fold_bn", True, "--no-fold-bn"),
               ("skip_layers", (), "--skip-layers"))


def encoder_export(family, model: nn.Module, ckpt: dict, options):
    """The export of an encoder checkpoint (a :class:`trtqat.stages.export.FamilyExport`):
    batch and sequence dynamic, validated at ``(2, max_length)`` and one other shape."""
    from trtqat.families.encoder.minilm import load_tokenizer
    from trtqat.families.types import FamilyExport

    given = [flag for attr, default, flag in _IMAGE_ONLY
             if getattr(options, attr, default) not in (default, None, (), [])]
    if given:
        verb = "is" if len(given) == 1 else "are"
        raise ExportError(f"{', '.join(given)} {verb} for CNN checkpoints only; "
                          f"{options.checkpoint} is a sentence encoder (batch and sequence are "
                          "always dynamic; use --max-length for the traced example length, "
                          "and set skip layers when calibrating)")
    spec, stage = ckpt["model"], str(ckpt.get("stage", "fp32"))
    limit = max_positions(model) or 512
    length = options.max_length or min(int(spec.get("max_length") or 128), limit)
    if not 2 <= length <= limit:
        raise ExportError(f"--max-length {length} is out of range: the encoder takes 2 to "
                          f"{limit} tokens")
    plan = encoder_plan(model, load_tokenizer(spec["arch"]), sentences=_sentences(options.data),
                        shapes=((2, length), (3, 9 if length != 9 else 7)), max_length=length)
    plan.checks = family.export_check
    arch = arch_label(str(spec["arch"]))
    return FamilyExport(plan, arch, "dynamic batch and sequence",
                        metadata={"trtqat.arch": arch, "trtqat.stage": stage,
                                  "trtqat.max_length": str(spec.get("max_length", length))},
                        info={"batch": "dynamic", "sequence": "dynamic", "max_length": length})


def _sentences(data: str | None) -> list[str]:
    if not data:
        return list(DEFAULT_SENTENCES)
    from trtqat.families.encoder.corpus import load_corpus

    return list(load_corpus(data).heldout[:MAX_VALIDATION_SENTENCES])


__all__ = ["DEFAULT_SHAPES", "MIN_COSINE", "MIN_MEAN_COSINE", "EncoderExporter",
           "check_shapes", "encoder_export", "encoder_plan", "export_encoder", "fidelity_check",
           "max_positions"]

"""What an ONNX export of a :class:`SentenceEncoder` needs: inputs, names, dynamic axes, shapes.

The export itself is ``trtqat.export``'s job; this module only describes the encoder's
interface so that an exporter, ONNX Runtime validation and ``trtqat-exec --shapes`` agree:

* inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the tokenizer makes
  them), int64, shape ``(batch, sequence)``, both axes dynamic;
* output ``sentence_embedding``, float32, ``(batch, hidden)``, batch dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtqat.families.encoder.minilm import tokenize

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAMES = ("sentence_embedding",)
BATCH_AXIS, SEQUENCE_AXIS = "batch", "sequence"
_FILLER = ("Quantization keeps the sentence embeddings of the encoder close to the float "
           "model, while the engine runs its matrix products in eight bit integers.")


def encoder_input_names(tokenizer=None) -> tuple[str, ...]:
    """Input names, in forward() order; ``token_type_ids`` only if the tokenizer makes them."""
    if tokenizer is not None and "token_type_ids" not in getattr(
            tokenizer, "model_input_names", INPUT_NAMES):
        return INPUT_NAMES[:2]
    return INPUT_NAMES


def encoder_dynamic_axes(input_names: Sequence[str] = INPUT_NAMES,
                         output_names: Sequence[str] = OUTPUT_NAMES) -> dict[str, dict[int, str]]:
    """``dynamic_axes`` for ``torch.onnx.export``: batch and sequence of every input."""
    axes = {name: {0: BATCH_AXIS, 1: SEQUENCE_AXIS} for name in input_names}
    axes.update({name: {0: BATCH_AXIS} for name in output_names})
    return axes


def encoder_dynamic_shapes(input_names: Sequence[str] = INPUT_NAMES,
                           max_sequence: int | None = None) -> dict[str, dict]:
    """``dynamic_shapes`` for the dynamo exporter (``torch.onnx.export(..., dynamo=True)``).

    ``max_sequence``: the longest sequence (the model's position embeddings; default 4096).
    """
    batch = torch.export.Dim(BATCH_AXIS, min=1, max=4096)
    seq = torch.export.Dim(SEQUENCE_AXIS, min=2, max=max_sequence or 4096)
    return {name: {0: batch, 1: seq} for name in input_names}


def example_inputs_for_encoder(tokenizer, batch_size: int = 2, max_length: int = 16,
                               sentences: Sequence[str] | None = None
                               ) -> dict[str, torch.Tensor]:
    """Real tokenized inputs of exactly ``(batch_size, max_length)``, in forward() order.

    Rows are truncated or padded to ``max_length``; when ``batch_size > 1`` the last row
    holds at most ``max_length // 2`` tokens, so that the attention mask's padding path is
    traced and validated too.
    """
    if batch_size < 1 or max_length < 2:
        raise ValueError(f"need batch_size >= 1 and max_length >= 2, got {batch_size}, "
                         f"{max_length}")
    sentences = list(sentences or [])
    while len(sentences) < batch_size:
        sentences.append(_FILLER)
    sentences = sentences[:batch_size]
    enc = tokenize(tokenizer, sentences, max_length=max_length, padding="max_length")
    if batch_size > 1:  # re-tokenize the last row to half the length, then pad it
        short = tokenize(tokenizer, sentences[-1:], max_length=max(2, max_length // 2),
                         padding="max_length")
        for name, value in short.items():
            pad = tokenizer.pad_token_id if name == "input_ids" else 0
            enc[name][-1] = torch.nn.functional.pad(value[0], (0, max_length - value.shape[1]),
                                                    value=pad)
    return {name: enc[name] for name in encoder_input_names(tokenizer) if name in enc}


def encoder_shapes(batch_size: int, max_length: int, input_names: Sequence[str] = INPUT_NAMES
                   ) -> str:
    """A ``--shapes`` value for ``trtqat-exec``/trtexec, e.g. ``input_ids:1x128,...``."""
    return ",".join(f"{name}:{batch_size}x{max_length}" for name in input_names)

"""Encoder checkpoints in the trtqat format (``trtqat.runs.checkpoint``).

The ``model`` spec of a sentence encoder::

    {"arch": "minilm" | "/path/to/hf-folder", "quantized": bool, "skip_layers": [...],
     "family": "transformer", "task": "sentence-embedding", "pooling": "mean",
     "normalize": True, "max_length": 128}

``family`` ("transformer", the tag of :class:`trtqat.families.encoder.EncoderFamily`) is how
``trtqat.families.of_checkpoint`` tells encoders from image classifiers. The architecture, tokenizer and (for ``fp32``) weights come from ``arch``; the
``state_dict`` holds the encoder's weights and, when quantized, every quantizer's amax.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from trtqat.errors import TrtqatError
from trtqat.families.cnn.model_source import is_quantizer_key
from trtqat.families.encoder.minilm import DEFAULT_MAX_LENGTH, MINILM, load_encoder
from trtqat.runs.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

FAMILY = "transformer"
TASK = "sentence-embedding"
STAGES = ("fp32", "ptq", "qat")


def encoder_spec(arch: str | Path = MINILM, quantized: bool = False,
                 max_length: int = DEFAULT_MAX_LENGTH, skip_layers: tuple[str, ...] = (),
                 normalize: bool = True) -> dict[str, Any]:
    """The ``model`` entry of an encoder checkpoint."""
    return {"arch": str(arch), "quantized": bool(quantized), "skip_layers": list(skip_layers),
            "family": FAMILY, "task": TASK, "pooling": "mean", "normalize": bool(normalize),
            "max_length": int(max_length)}


def is_encoder_checkpoint(ckpt: dict[str, Any]) -> bool:
    """True for a checkpoint written by :func:`save_encoder_checkpoint`."""
    return isinstance(ckpt.get("model"), dict) and ckpt["model"].get("family") == FAMILY


def save_encoder_checkpoint(path: str | os.PathLike, model: nn.Module, *, stage: str,
                            spec: dict[str, Any], metrics: dict[str, Any] | None = None,
                            args: dict[str, Any] | None = None, **extra: Any) -> Path:
    """Write an encoder (FP32 or quantized) atomically; ``spec`` from :func:`encoder_spec`."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if spec.get("family") != FAMILY:
        raise ValueError("spec must come from encoder_spec()")
    payload = {"stage": stage, "model": dict(spec), "state_dict": model.state_dict(),
               "metrics": dict(metrics or {}), "args": dict(args or {}), **extra}
    return save_checkpoint(path, payload)


def build_encoder_from_checkpoint(ckpt: dict[str, Any], quantized: bool | None = None):
    """``(SentenceEncoder, tokenizer)`` rebuilt from an encoder checkpoint, in eval mode.

    ``quantized=None`` builds what the checkpoint holds; ``True`` on an FP32 checkpoint
    gives an uncalibrated quantized encoder (the start of PTQ); ``False`` on a quantized
    one drops the quantizers (its fine-tuned weights in float).
    """
    if not is_encoder_checkpoint(ckpt):
        raise CheckpointError("not an encoder checkpoint (model.family is not 'transformer'): "
                              "load CNN checkpoints with trtqat.runs.checkpoint")
    spec = ckpt["model"]
    holds_quant = bool(spec.get("quantized"))
    quantized = holds_quant if quantized is None else quantized
    try:
        model, tokenizer = load_encoder(spec["arch"], weights=False)
    except TrtqatError as exc:
        raise CheckpointError(f"cannot rebuild the checkpoint's encoder: {exc}") from None
    model.normalize = bool(spec.get("normalize", True))
    if quantized:
        from trtqat.families.quant_format import apply_spec_format
        from trtqat.quant.plugins.transformer import quantize_transformer

        apply_spec_format(quantize_transformer(
            model, skip_layers=tuple(spec.get("skip_layers") or ())), spec)
    state = ckpt["state_dict"]
    if not quantized:
        state = {k: v for k, v in state.items() if not is_quantizer_key(k)}
    try:
        result = model.load_state_dict(state, strict=False)
    except (RuntimeError, TrtqatError) as exc:
        raise CheckpointError(f"checkpoint does not fit {spec['arch']}: "
                              f"{str(exc).splitlines()[0][:200]}") from None
    bad = [k for k in result.missing_keys if not (quantized and not holds_quant
                                                  and is_quantizer_key(k))]
    bad += list(result.unexpected_keys)
    if bad:
        raise CheckpointError(f"checkpoint does not fit {spec['arch']} ({len(bad)} mismatched "
                              f"keys, e.g. {bad[0]}): it was saved from another model")
    return model.eval(), tokenizer


def load_encoder_checkpoint(path: str | os.PathLike, quantized: bool | None = None):
    """``(SentenceEncoder, tokenizer, checkpoint dict)`` from an encoder checkpoint file."""
    ckpt = load_checkpoint(path)
    model, tokenizer = build_encoder_from_checkpoint(ckpt, quantized)
    return model, tokenizer, ckpt

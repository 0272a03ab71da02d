"""The quantized format (:mod:`trtqat.formats`) a checkpoint records, for every family.

``trtqat calibrate --format`` records it in the checkpoint's model spec (``"format"``, and
``"block_size"`` for int4); every family re-applies it when it rebuilds a quantized model
(placement first, then :func:`trtqat.quant.format_apply.apply_format`, then the state dict),
so qat, export, compare and sensitivity see the quantizers calibrate made. Checkpoints without
a ``format`` are int8.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trtqat.errors import TrtqatError
from trtqat.formats import DEFAULT_BLOCK_SIZE, of_checkpoint


class FormatMismatchError(TrtqatError, ValueError):
    """``trtqat qat --format`` names another format than its checkpoint's."""


def spec_format(spec: dict[str, Any]) -> tuple[str, int]:
    """``(format, block_size)`` of a checkpoint's model spec (old ones: int8)."""
    return of_checkpoint({"model": spec}), int(spec.get("block_size") or DEFAULT_BLOCK_SIZE)


def apply_spec_format(model: nn.Module, spec: dict[str, Any]) -> nn.Module:
    """``model``'s just-placed quantizers made the spec's format, in place; returns it."""
    from trtqat.quant.format_apply import apply_format

    name, block_size = spec_format(spec)
    if name != "int8":
        apply_format(model, name, block_size, bool(spec.get("int4_embeddings")))
    return model


def record_format(spec: dict[str, Any], name: str, block_size: int | None = None,
                  embeddings: bool = False) -> dict[str, Any]:
    """``spec`` (updated in place) saying ``name`` (and ``block_size`` for int4, and
    ``int4_embeddings`` when its embedding tables are INT4 too)."""
    spec["format"] = name
    spec.pop("int4_embeddings", None)
    if name == "int4":
        spec["block_size"] = int(block_size or DEFAULT_BLOCK_SIZE)
        if embeddings:
            spec["int4_embeddings"] = True
    else:
        spec.pop("block_size", None)
    return spec


def int4_tables(cfg: Any) -> bool:
    """Whether a stage's options ask for INT4 embedding tables (``--int4-embeddings``)."""
    return bool(getattr(cfg, "int4_embeddings", False))


def with_format(ckpt: dict[str, Any], name: str, block_size: int | None = None,
                embeddings: bool = False) -> dict[str, Any]:
    """A shallow copy of the FP32 checkpoint ``ckpt`` whose spec asks for ``name``: what
    ``family.load(..., quantized=True)`` builds the start of PTQ from."""
    return {**ckpt, "model": record_format(dict(ckpt["model"]), name, block_size, embeddings)}


def check_qat_format(cfg: Any, spec: dict[str, Any], checkpoint: str) -> None:
    """``trtqat qat`` keeps its checkpoint's format: a ``--format``/``--block-size`` naming
    another one is a one-line error."""
    name, block_size = spec_format(spec)
    asked = getattr(cfg, "format", None)
    if asked is not None and asked != name:
        raise FormatMismatchError(
            f"{checkpoint} was calibrated as {name}, not {asked}: QAT keeps the checkpoint's "
            f"format; drop --format, or calibrate the FP32 checkpoint again with --format "
            f"{asked}")
    size = getattr(cfg, "block_size", None)
    if size is not None and name != "int4":
        raise FormatMismatchError(f"--block-size goes with int4 checkpoints; {checkpoint} is "
                                  f"{name}: drop --block-size")
    if size is not None and size != block_size:
        raise FormatMismatchError(
            f"{checkpoint} holds int4 blocks of {block_size}, not {size}: drop --block-size, "
            f"or calibrate again with --block-size {size}")

"""The quantized formats, in one table: INT8 (the default), FP8 E4M3 and INT4 block-wise
weights. Pure Python (the CLI reads it at start-up).

``trtqat.quantize(model, {"format": "fp8"})``, ``trtqat calibrate/qat --format``, the
checkpoint's recorded format and the ONNX variants of each format (``trtqat.variants``:
a variant's ``format`` column) all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    """One row of the formats table."""

    name: str            # --format, QuantConfig.format, the checkpoint's "format"
    label: str           # what it quantizes (help texts, reports)
    activations: bool    # activation quantizers (False: weight-only)
    min_opset: int       # lowest ONNX opset of its Q/DQ


TABLE: tuple[Format, ...] = (
    Format("int8", "INT8 Q/DQ, activations and weights", True, 13),
    Format("fp8", "FP8 E4M3 Q/DQ, activations and weights (Hopper, Ada, Blackwell)", True, 19),
    Format("int4", "INT4 block-wise weights of Linear/MatMul layers, float activations "
                   "(W4A16)", False, 21),
)
BY_NAME = {f.name: f for f in TABLE}
FORMATS = tuple(f.name for f in TABLE)
DEFAULT = "int8"
BLOCK_SIZES = (32, 64, 128)
DEFAULT_BLOCK_SIZE = 128


def fmt(name: str) -> Format:
    """The row of ``name``; ValueError naming the valid ones for an unknown one."""
    row = BY_NAME.get(name)
    if row is None:
        raise ValueError(f"unknown format {name!r}: use one of {', '.join(FORMATS)}")
    return row


def of_checkpoint(ckpt: dict) -> str:
    """The format a checkpoint's quantizers were made with (older checkpoints: int8)."""
    spec = ckpt.get("model") or {}
    return str(spec.get("format") or DEFAULT)

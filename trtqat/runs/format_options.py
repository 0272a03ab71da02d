"""``--format`` and ``--block-size`` of ``trtqat calibrate`` and ``trtqat qat``: their help
texts (from :mod:`trtqat.formats`) and their one-line checks."""

from __future__ import annotations

from typing import Any

from trtqat.formats import BLOCK_SIZES, DEFAULT, DEFAULT_BLOCK_SIZE, FORMATS, TABLE
from trtqat.runopts import ConfigError

ENTROPY_FP8 = ("--method entropy (TensorRT's INT8 KL divergence over uniform levels) has no "
               "FP8 form: use --method max, percentile or mse with --format fp8")


INT4_EMBEDDINGS_HELP = (
    "int4: the embedding tables too (blocks along the embedding dimension; a transformer's "
    "file shrinks ~3x against fp16 only with them, as its word embeddings hold about half its "
    "weights)")


def format_help(qat: bool = False, demo: bool = False) -> str:
    """The help of ``--format``: every format of the table, and its default (``demo``: the
    demo's comma-separated list)."""
    if demo:
        return ("quantized formats to calibrate and QAT-train, separated by commas: "
                f"{', '.join(FORMATS)} (e.g. fp8,int8 puts FP8 PTQ and QAT rows beside INT8's; "
                "fp8 is for Hopper/Ada/Blackwell GPUs, emulated by ONNX Runtime on the CPU; "
                f"int4 quantizes Linear weights only) (default: {DEFAULT})")
    rows = "; ".join(f"{f.name}: {f.label}" for f in TABLE)
    if qat:
        return f"quantized format ({rows}); default: the checkpoint's (QAT keeps it)"
    return (f"quantized format ({rows}), recorded in the checkpoint; fp8 calibrates with "
            "--method max, percentile or mse")


def block_size_help() -> str:
    """The help of ``--block-size``."""
    return (f"int4: weights per block of this many input channels, one scale each "
            f"({', '.join(map(str, BLOCK_SIZES))}; default {DEFAULT_BLOCK_SIZE})")


def check_format_options(cfg: Any, qat: bool = False) -> None:
    """``cfg.format`` / ``cfg.block_size`` (None: the default, or for QAT the checkpoint's)
    valid, and ``--method`` (if any) one the format has."""
    name, size = getattr(cfg, "format", None), getattr(cfg, "block_size", None)
    if name is not None and name not in FORMATS:
        raise ConfigError(f"unknown --format {name!r}: use one of {', '.join(FORMATS)}")
    if size is not None and (isinstance(size, bool) or size not in BLOCK_SIZES):
        raise ConfigError(f"--block-size must be one of {', '.join(map(str, BLOCK_SIZES))}, "
                          f"got {size!r}")
    if size is not None and not qat and name != "int4":
        raise ConfigError(f"--block-size goes with --format int4 (INT4 weight blocks), not "
                          f"{name or DEFAULT}: drop it")
    if getattr(cfg, "int4_embeddings", False) and name != "int4":
        raise ConfigError(f"--int4-embeddings goes with --format int4, not {name or DEFAULT}: "
                          "drop it")
    if name == "fp8" and getattr(cfg, "method", None) == "entropy":
        raise ConfigError(ENTROPY_FP8)

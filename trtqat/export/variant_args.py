"""The variant and opset arguments of an export: checked (one-line errors) and the opset a
variant is written at."""

from __future__ import annotations

import logging

import onnx

from trtqat.export.errors import ExportError
from trtqat.variants import DEFAULT_OPSET, MIN_OPSET, VARIANTS
from trtqat.variants import variant as variant_row

log = logging.getLogger(__name__)

# formats whose Q/DQ an explicit lower opset cannot express (int8-fp16 is raised silently)
NEEDS_OPSET = {"fp8": "FP8 Q/DQ", "int4": "DequantizeLinear with INT4 blocks"}


def target_opset(variant: str, opset: int | None) -> int:
    """``opset``, raised to the variant's minimum (int8-fp16: fp16 Q/DQ scales need 19).

    Only int8-fp16 is raised (see :func:`check_args` for the others); ``opset`` None is the
    default opset, raised for every variant."""
    low = variant_row(variant).min_opset
    if opset is None:
        return max(DEFAULT_OPSET, low)
    if opset < low:
        log.info("%s uses opset %d, not %d", variant, low, opset)
        return low
    return opset


def check_args(variant: str, opset: int | None) -> None:
    """:class:`ExportError` for an unknown variant or an opset out of range (an explicit
    opset below an FP8 variant's minimum included; None: the default opset)."""
    if variant not in VARIANTS:
        raise ExportError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    row = variant_row(variant)
    if opset is None:
        return
    top = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise ExportError(f"opset must be an int, got {opset!r} ({type(opset).__name__})")
    if not MIN_OPSET <= opset <= top:
        raise ExportError(f"--opset {opset} is out of range: per-channel Q/DQ needs >= "
                          f"{MIN_OPSET}, and this onnx knows up to {top}")
    if row.format in NEEDS_OPSET and opset < row.min_opset:
        raise ExportError(f"--opset {opset} is too low for {variant}: {NEEDS_OPSET[row.format]} "
                          f"needs opset >= {row.min_opset}; use --opset {row.min_opset} or "
                          "leave --opset out")

"""Stable, self-describing names for exported files."""

from __future__ import annotations

import re

VARIANTS = ("fp32", "fp16", "int8", "int8-fp16")
"""Every variant, in the order ``--variant all`` exports them."""

INT8_VARIANTS = ("int8", "int8-fp16")
FP16_VARIANTS = ("fp16", "int8-fp16")


def artifact_name(arch: str, stage: str, variant: str, batch: int | None = None) -> str:
    """File name of an exported variant, e.g. ``resnet18-qat-int8.onnx``.

    ``stage`` is the checkpoint stage (fp32, ptq, qat); an FP32-trained model drops it
    (``resnet18-fp16.onnx``). A fixed batch adds ``-b<N>``; a dynamic batch adds nothing.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
    arch = re.sub(r"[^A-Za-z0-9_.]+", "_", arch)
    parts = [arch] if stage in ("", "fp32") else [arch, stage]
    parts.append(variant)
    if batch is not None:
        parts.append(f"b{batch}")
    return "-".join(parts) + ".onnx"


def expand_variants(variant: str) -> tuple[str, ...]:
    """``all`` -> every variant; one name -> itself (checked)."""
    if variant == "all":
        return VARIANTS
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {', '.join(VARIANTS)} or all")
    return (variant,)

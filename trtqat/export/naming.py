"""Stable, self-describing names for exported files (the rule lives in the variants table)."""

from __future__ import annotations

from trtqat.variants import (
    FP16_VARIANTS,
    INT8_VARIANTS,
    VARIANTS,
    arch_label,
    artifact_name,
    expand_variants,
    ptq_tag,
    stage_tag,
)

__all__ = ["FP16_VARIANTS", "INT8_VARIANTS", "VARIANTS", "arch_label", "artifact_name",
           "expand_variants", "ptq_tag", "stage_tag"]

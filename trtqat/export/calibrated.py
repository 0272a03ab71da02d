"""Refuse to export a model whose activation quantizers were never calibrated.

A TensorQuantizer without amax quantizes each tensor with that tensor's own range (as
pytorch-quantization does), which is fine for experiments but cannot be deployed: an ONNX
Q/DQ scale is a constant, so the export would bake in the range of one example batch.
"""

from __future__ import annotations

from torch import nn

from trtqat.export.errors import ExportError
from trtqat.quant.model_ops import quantizers


def uncalibrated_activation_quantizers(model: nn.Module) -> list[str]:
    """Names of the enabled, quantizing, non-weight quantizers that have no amax."""
    return [name for name, q in quantizers(model)
            if not q.disabled and q._if_quant and q.amax is None and not hasattr(q, "clip")
            and not name.endswith("weight_quantizer")]


def refuse_uncalibrated(model: nn.Module) -> None:
    """Raise :class:`ExportError` (one line) if an activation quantizer was never calibrated."""
    names = uncalibrated_activation_quantizers(model)
    if not names:
        return
    others = ""
    if len(names) > 1:
        listed = ", ".join(f"'{n}'" for n in names[1:3]) + (", ..." if len(names) > 3 else "")
        others = f", nor are {len(names) - 1} other(s) ({listed})"
    raise ExportError(
        f"activation quantizer '{names[0]}' is not calibrated (amax is missing){others}: run "
        "`trtqat calibrate` (or collect_stats + compute_amax) before exporting INT8, or leave "
        "those layers in float (--skip-layers)")

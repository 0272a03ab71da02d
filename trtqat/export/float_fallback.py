"""Layers with no INT8 form are left in float automatically, with a note.

Some layers trace into ops TensorRT cannot run in INT8: ``AdaptiveAvgPool2d((7, 7))`` on a
2x2 map (VGG at 64 px) becomes a ``GatherND`` that upsamples, and a Q/DQ in front of it
makes our own lint refuse the file. The Q/DQ graph is linted once before the variants are
written; the layers whose quantized output feeds such an op get their quantizers disabled
and the model is traced again, so the file keeps every other layer in INT8.
"""

from __future__ import annotations

import re

import onnx

from trtqat.export.lint import lint_model

# the lint's no-int8-form message ends with "(--skip-layers LAYER)"
_LAYER = re.compile(r"--skip-layers ([^)\s]+)\)")


def layers_without_int8_form(model: onnx.ModelProto) -> list[str]:
    """Layers whose quantized output feeds an op that has no INT8 form in TensorRT."""
    layers = []
    for finding in lint_model(model).errors:
        match = _LAYER.search(finding.message) if finding.rule == "no-int8-form" else None
        if match:
            layers.append(match.group(1))
    return list(dict.fromkeys(layers))


def fallback_note(layers: list[str], ops: str = "") -> str:
    """The note an export prints for layers it left in float."""
    return (f"left in float automatically (no INT8 form in TensorRT{ops}): "
            f"{', '.join(layers)}")

"""Engine hints: what a model family tells the engine builders, carried inside the ONNX file.

A family declares :class:`EngineHints` (``ModelFamily.engine_hints``); the exporter writes
them into every file's metadata under :data:`HINTS_KEY` and keeps the fp16-sensitive ops
float32 in fp16 variants. The engine side reads them back with :func:`read_hints`, so
engines never need to know which family a file came from: the ORT CPU re-encoding
(``trtqat.engines.ort_qdq``) runs the passes the hints name, all of them when none are
named.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from trtqat.engines.errors import EngineBuildError

log = logging.getLogger(__name__)

HINTS_KEY = "trtqat.engine_hints"

# The ORT CPU re-encoding passes (trtqat.engines.ort_qdq.reencode_for_cpu), in run order.
ORT_PASSES = ("fold_constants", "prequantize_weights", "fold_batchnorm", "reducemean_to_gap",
              "unify_quantizers", "float_narrow_convs", "integer_activations",
              "output_quantizers", "absorb_clips", "reencode_uint8", "quantize_move_outputs",
              "quantize_gemm_bias", "fuse_matmul_epilogues", "float_output_convs")


@dataclass(frozen=True)
class EngineHints:
    """What engine builders should know about a family's graphs.

    ``ort_rewrites``: the ORT CPU re-encoding passes to run (of :data:`ORT_PASSES`; empty:
    every pass that applies). ``fp16_sensitive_ops``: ONNX op types kept float32 in fp16
    variants (their inputs and outputs cast), e.g. ``LayerNormalization``, ``Softmax``.
    """

    ort_rewrites: tuple[str, ...] = ()
    fp16_sensitive_ops: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [p for p in self.ort_rewrites if p not in ORT_PASSES]
        if unknown:
            raise EngineBuildError(f"unknown ORT rewrite(s) {', '.join(unknown)} in the engine "
                                   f"hints: use {', '.join(ORT_PASSES)}")

    def __bool__(self) -> bool:
        return bool(self.ort_rewrites or self.fp16_sensitive_ops)

    def ort_passes(self) -> tuple[str, ...]:
        """The ORT passes to run: the hinted ones in run order, else all."""
        return tuple(p for p in ORT_PASSES if p in self.ort_rewrites) or ORT_PASSES

    def to_json(self) -> str:
        """The metadata value: ``{"ort_rewrites": [...], "fp16_sensitive_ops": [...]}``."""
        return json.dumps({"ort_rewrites": list(self.ort_rewrites),
                           "fp16_sensitive_ops": list(self.fp16_sensitive_ops)})

    def metadata(self) -> dict[str, str]:
        """``{HINTS_KEY: to_json()}``, or nothing for empty hints."""
        return {HINTS_KEY: self.to_json()} if self else {}


def read_hints(model: Any) -> EngineHints:
    """The hints an ONNX model (``onnx.ModelProto``) carries; empty hints when it has none,
    and (with a warning) when its entry is unreadable or names passes this trtqat lacks."""
    text = next((p.value for p in model.metadata_props if p.key == HINTS_KEY), None)
    if text is None:
        return EngineHints()
    try:
        data = json.loads(text)
        return EngineHints(tuple(map(str, data.get("ort_rewrites") or ())),
                           tuple(map(str, data.get("fp16_sensitive_ops") or ())))
    except (ValueError, TypeError, AttributeError, EngineBuildError) as exc:
        log.warning("ignoring the model's %s metadata (%s): every ORT pass runs", HINTS_KEY,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return EngineHints()


__all__ = ["HINTS_KEY", "ORT_PASSES", "EngineHints", "read_hints"]

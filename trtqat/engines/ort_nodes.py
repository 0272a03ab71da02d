"""What an ONNX Runtime engine computes in integer and in float, and the one-line warning for
an INT8 (Q/DQ) model that ends up mostly float.

The ORT builder stores :func:`node_summary` of its optimised payload in the engine header
(``compute_nodes``); ``trtqat build`` and ``trtqat-exec`` log :func:`mostly_float_note` of
that header as a warning, so a user sees at build time that an INT8 engine will not be
faster than FP32 (e.g. ``Conv -> Clip -> Q`` left as float ``FusedConv`` between Q/DQ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx

TOP_FLOAT = 3  # float op types named in the warning
HEAVY_WORDS = ("Conv", "Gemm", "MatMul", "Attention")  # the nodes INT8 speeds up


def is_qdq_model(model: onnx.ModelProto) -> bool:
    """True when ``model`` quantizes an activation (a QuantizeLinear on a non-constant)."""
    consts = {t.name for t in model.graph.initializer}
    consts.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    return any(n.op_type == "QuantizeLinear" and n.input[0] not in consts
               for n in model.graph.node)


def node_summary(optimized: onnx.ModelProto, qdq_source: bool) -> dict[str, Any]:
    """``{"qdq_source", "integer", "float", "integer_ops": {op: n}, "float_ops": {op: n}}``
    of an ORT-optimised graph (see :func:`trtqat.engines.ort_qdq.count_compute_nodes`)."""
    from trtqat.engines.ort_qdq import count_compute_nodes

    counts = count_compute_nodes(optimized)
    return {"qdq_source": qdq_source, "integer": counts["integer_total"],
            "float": counts["float_total"], "integer_ops": _by_count(counts["integer"]),
            "float_ops": _by_count(counts["float"])}


def _by_count(ops: Mapping[str, Any]) -> dict[str, int]:
    """``ops`` most frequent first (a loaded engine's sidecar stores them sorted by name)."""
    return dict(sorted(((op, int(n)) for op, n in ops.items()), key=lambda kv: (-kv[1], kv[0])))


def _heavy(ops: Mapping[str, int]) -> dict[str, int]:
    """The convolutions and matrix products among ``ops`` (float or integer forms: Conv,
    FusedConv, QLinearConv, ConvInteger, Gemm, QGemm, MatMul, MatMulIntegerToFloat, ...)."""
    return {op: n for op, n in ops.items() if any(w in op for w in HEAVY_WORDS)}


def mostly_float_note(header: Mapping[str, Any]) -> str | None:
    """The warning line for an engine built from a Q/DQ model whose float convolutions and
    matrix products outnumber its integer ones (the nodes INT8 speeds up; LayerNorm, GELU
    and the like stay float in TensorRT too), else None."""
    summary = header.get("compute_nodes")
    if not isinstance(summary, Mapping) or not summary.get("qdq_source"):
        return None
    formats = header.get("quant_formats")  # absent from older sidecars: INT8 was the only one
    if formats is not None and "int8" not in formats:
        return None  # FP8/INT4 files: trtqat.engines.qformats.cpu_format_notes says it
    floats = _heavy(_by_count(summary.get("float_ops") or {}))
    ints = summary.get("integer_ops")  # absent from older sidecars: every integer node
    integer = (sum(_heavy(ints).values()) if isinstance(ints, Mapping)
               else int(summary.get("integer", 0)))
    floating = sum(floats.values())
    if floating <= integer:
        return None
    top = ", ".join(f"{op} {n}" for op, n in list(floats.items())[:TOP_FLOAT])
    return (f"INT8 (Q/DQ) model runs mostly in float on ONNX Runtime: {integer} integer vs "
            f"{floating} float convolution/matmul nodes (most float: {top}); expect little or "
            "no INT8 speed-up over FP32")


__all__ = ["is_qdq_model", "mostly_float_note", "node_summary"]

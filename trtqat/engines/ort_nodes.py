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


def is_qdq_model(model: onnx.ModelProto) -> bool:
    """True when ``model`` quantizes an activation (a QuantizeLinear on a non-constant)."""
    consts = {t.name for t in model.graph.initializer}
    consts.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    return any(n.op_type == "QuantizeLinear" and n.input[0] not in consts
               for n in model.graph.node)


def node_summary(optimized: onnx.ModelProto, qdq_source: bool) -> dict[str, Any]:
    """``{"qdq_source", "integer", "float", "float_ops": {op: n}}`` of an ORT-optimised
    graph (see :func:`trtqat.engines.ort_qdq.count_compute_nodes`)."""
    from trtqat.engines.ort_qdq import count_compute_nodes

    counts = count_compute_nodes(optimized)
    float_ops = dict(sorted(counts["float"].items(), key=lambda kv: (-kv[1], kv[0])))
    return {"qdq_source": qdq_source, "integer": counts["integer_total"],
            "float": counts["float_total"], "float_ops": float_ops}


def mostly_float_note(header: Mapping[str, Any]) -> str | None:
    """The warning line for an engine built from a Q/DQ model whose float compute nodes
    outnumber its integer ones, else None."""
    summary = header.get("compute_nodes")
    if not isinstance(summary, Mapping) or not summary.get("qdq_source"):
        return None
    integer, floating = int(summary.get("integer", 0)), int(summary.get("float", 0))
    if floating <= integer:
        return None
    # most frequent first: a loaded engine's sidecar stores the ops sorted by name
    ops = sorted((summary.get("float_ops") or {}).items(), key=lambda kv: (-int(kv[1]), kv[0]))
    top = ", ".join(f"{op} {n}" for op, n in ops[:TOP_FLOAT])
    return (f"INT8 (Q/DQ) model runs mostly in float on ONNX Runtime: {integer} integer vs "
            f"{floating} float compute nodes (most float: {top}); expect little or no INT8 "
            "speed-up over FP32")


__all__ = ["is_qdq_model", "mostly_float_note", "node_summary"]

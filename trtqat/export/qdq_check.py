"""The Q/DQ inventory: every active quantizer is in the file, with its own scale.

Exported Q/DQ nodes are named after their quantizer (``layer1.0.conv1._input_quantizer/
QuantizeLinear``), so each one can be checked against the model: a missing pair, a pair
for a disabled quantizer, or a scale other than ``amax / maxbound`` is a wrong export,
whatever the outputs say. The exporter merges identical Q/DQ on one tensor (two
quantizers with the same amax reading the same activation), so a quantizer without a node
of its own passes when a Q/DQ with exactly its scale exists.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from torch import nn

from trtqat.export._graph import GraphIndex
from trtqat.export.validate import Check
from trtqat.quant.model_ops import quantizers

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _expected_scale(q) -> np.ndarray:
    return (q.amax.detach().double().cpu().numpy() / float(q.maxbound)).ravel()


def _same(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    return a.size == b.size and bool(np.allclose(a, b, rtol=rtol, atol=0.0))


def check_qdq_inventory(graph_model: onnx.ModelProto, model: nn.Module,
                        fp16: bool = False) -> Check:
    """Compare the Q/DQ nodes of ``graph_model`` with the quantizers of ``model`` (the
    module that was traced, BatchNorm already folded). ``fp16`` (an fp16 variant) allows
    scales fp16 rounding, as do fp16 scales found in the graph."""
    g = GraphIndex(graph_model.graph)
    found: dict[str, list[tuple[str, np.ndarray | None]]] = defaultdict(list)
    all_scales = []
    for node in graph_model.graph.node:
        if node.op_type not in _QDQ or len(node.input) < 2:
            continue
        scale = g.constant(node.input[1])
        if scale is not None:
            fp16 |= scale.dtype == np.float16
            scale = scale.astype(np.float64).ravel()
            all_scales.append(scale)
        found[node.name.split("/")[0]].append((node.name, scale))
    rtol = 2e-3 if fp16 else 1e-5
    problems: list[str] = []
    active = 0
    for name, q in quantizers(model):
        nodes = found.get(name, [])
        if q.disabled or not q._if_quant or q.amax is None:
            if nodes:
                problems.append(f"{nodes[0][0]} quantizes for '{name}', which is disabled")
            continue
        active += 1
        want = _expected_scale(q)
        if not nodes:
            if not any(_same(s, want, rtol) for s in all_scales):
                problems.append(f"no Q/DQ for '{name}' (missing pair)")
            continue
        for node_name, scale in nodes:
            if scale is None:
                problems.append(f"{node_name} has a run-time scale")
            elif not _same(scale, want, rtol):
                i = int(np.argmax(np.abs(scale - want))) if scale.size == want.size else 0
                problems.append(f"{node_name} scale {scale[i]:.4g}, expected amax / "
                                f"{q.maxbound} = {want[i]:.4g}")
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return Check("Q/DQ vs quantizers", False,
                     "; ".join(problems[:3]) + more + ": the graph is not the model")
    return Check("Q/DQ vs quantizers", True,
                 f"{active} active quantizers, each with its Q/DQ and scale amax / maxbound")

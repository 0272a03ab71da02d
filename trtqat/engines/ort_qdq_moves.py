"""Data movement on quantized values stays on uint8 for every reader, in ONNX Runtime.

ORT runs ``DQ -> Split/Transpose/Reshape/... -> Q`` on the integers only when a Q with the
input's scale and zero-point reads *each* output. After :func:`~trtqat.engines.ort_qdq_units.
complete_units` an output that a float op reads (efficientvit's linear attention: the Split
of q, k, v whose k goes into a Relu, the v into a Pad) has no such Q, so ORT dequantizes the
whole input, splits floats, and quantizes the other outputs back (three passes where one
uint8 Split does).

:func:`quantize_move_outputs` gives such an output a ``Q -> DQ`` with the input's own
parameters and moves its float readers onto the DQ. Exact: the op only moves values that
came out of that DQ, so they are on its grid and the pair returns them unchanged.
"""

from __future__ import annotations

import onnx
from onnx import helper

from trtqat.engines.ort_qdq_graph import Graph
from trtqat.engines.ort_qdq_units import MOVE_OPS

# ops that move values without changing them (Resize: nearest only; MaxPool picks one)
_EXACT_MOVES = MOVE_OPS - {"Resize", "MaxPool"}


def _input_dq(g: Graph, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The activation DequantizeLinear (per tensor, constant parameters) ``node`` reads."""
    if not node.input:
        return None
    dq = g.producer.get(node.input[0])
    if dq is None or dq.op_type != "DequantizeLinear" or g.is_const(dq.input[0]):
        return None
    params = [i for i in dq.input[1:] if i]
    if not params or not all(g.is_const(i) and g.const(i).size == 1 for i in params):
        return None
    return dq


def _same_params(q: onnx.NodeProto, dq: onnx.NodeProto, g: Graph) -> bool:
    if q.op_type != "QuantizeLinear" or len(q.input) != len(dq.input):
        return False
    return all(a == b or (g.const(a) is not None and g.const(b) is not None
                          and g.const(a).dtype == g.const(b).dtype
                          and (g.const(a) == g.const(b)).all())
               for a, b in zip(q.input[1:], dq.input[1:]))


def _dq_reading(g: Graph, q: onnx.NodeProto) -> str:
    """The output of a DequantizeLinear of ``q`` with its parameters (added if none)."""
    for r in g.consumers.get(q.output[0], []):
        if r.op_type == "DequantizeLinear" and list(r.input[1:]) == list(q.input[1:]):
            return r.output[0]
    out = g.fresh(f"{q.input[0]}_dq")
    g.graph.node.append(helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:]],
                                         [out], name=g.fresh("DequantizeLinear")))
    return out


def quantize_move_outputs(g: Graph) -> int:
    """Put the input's ``Q -> DQ`` on every output of a data-movement op that has one on
    some outputs but not all (module doc); returns how many outputs got one."""
    g.reindex()
    added = 0
    for node in list(g.graph.node):
        dq = _input_dq(g, node) if node.op_type in _EXACT_MOVES else None
        outs = [o for o in node.output if o]
        if dq is None or any(o in g.outputs for o in outs):
            continue
        qs = [next((r for r in g.consumers.get(o, []) if _same_params(r, dq, g)), None)
              for o in outs]
        if all(q is not None for q in qs) or all(q is None for q in qs):
            continue  # all on integers already, or none: ORT keeps the op float anyway
        for out, q in zip(outs, qs):
            readers = [r for r in g.consumers.get(out, []) if not _same_params(r, dq, g)]
            if not readers:
                continue
            if q is None:
                q = helper.make_node("QuantizeLinear", [out, *dq.input[1:]],
                                     [g.fresh(f"{out}_q")], name=g.fresh("QuantizeLinear"))
                g.graph.node.append(q)
                added += 1
            target = _dq_reading(g, q)
            for r in readers:
                for k, i in enumerate(r.input):
                    if i == out:
                        r.input[k] = target
        g.reindex()
    if added:
        g.finish()
    return added


__all__ = ["quantize_move_outputs"]

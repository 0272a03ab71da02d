"""Narrow convolutions that ONNX Runtime's CPU provider runs faster in float than in INT8.

MLAS's integer convolutions work on blocks of 16 and more output channels; its float
convolutions have a channels-blocked (NCHWc) direct kernel with the activation fused. A
conv with fewer than 16 output channels on a feature map of 32 x 32 or more (an image stem,
3 -> 8 channels at full resolution, or a depthwise conv on those channels) wastes most of
each integer block, and with the integer HardSwish gate (:mod:`trtqat.engines.ort_qdq_act`)
after it runs slower than one fused float conv: efficientvit_b0's first two convs took
0.5 ms of a 3.6 ms INT8 engine at 224 px, twice their FP32 time.

:func:`float_narrow_convs` gives such a conv float weights, the exact values its weight
``DequantizeLinear`` produced (``(w - zero_point) * scale`` in float32), so ORT does not
fuse it into ``QLinearConv``: it computes what the Q/DQ graph computes (a float conv on the
dequantized input and weights), with no output requantization. Its input ``Q -> DQ`` stays,
so the result equals the exported graph's up to float summation order. The pass runs
before the activation and output-quantizer passes, which then leave a float conv's
activation float (fused by ORT) and quantize only what the next integer layer reads.

Only convs whose output only a float activation reads qualify (HardSwish, HardSigmoid,
Sigmoid, Tanh, LeakyRelu): ORT's ``WeightBiasQuantization`` would quantize the float
weights of a conv a ``QuantizeLinear`` reads again, per tensor (coarser than the exported
per-channel scales).
"""

from __future__ import annotations

import numpy as np
import onnx

from trtqat.engines.ort_qdq_graph import Graph, attr

NARROW_CHANNELS = 16  # fewer output channels than one MLAS integer block
# and a feature map large enough that the conv, not the per-node overhead of the float
# path's extra nodes (DequantizeLinear, NCHWc reorders), sets the time
MIN_POSITIONS = 32 * 32
# activations ORT's float conv fuses (with an integer conv they need extra passes)
_FUSED_FLOAT_ACTS = frozenset({"HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "LeakyRelu"})


def _weight_dq(g: Graph, conv: onnx.NodeProto) -> onnx.NodeProto | None:
    """The weight's DequantizeLinear of constant integers with constant parameters."""
    dq = g.producer.get(conv.input[1]) if len(conv.input) > 1 else None
    if dq is None or dq.op_type != "DequantizeLinear" or attr(dq, "block_size", 0):
        return None
    if not all(g.is_const(i) for i in dq.input if i):
        return None
    return dq


def _activation_dq(g: Graph, name: str) -> bool:
    dq = g.producer.get(name)
    return dq is not None and dq.op_type == "DequantizeLinear" and not g.is_const(dq.input[0])


def dequantized(g: Graph, dq: onnx.NodeProto) -> np.ndarray | None:
    """The float32 tensor a constant DequantizeLinear produces, None when not finite."""
    w = g.const(dq.input[0])
    scale = g.const(dq.input[1])
    zp = g.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), w.dtype)
    if w is None or scale is None or zp is None or w.dtype.kind not in "iu":
        return None
    axis = attr(dq, "axis", 1) % max(w.ndim, 1)
    shape = [1] * w.ndim
    if scale.size > 1:
        shape[axis] = -1
    s = scale.astype(np.float32).reshape(shape if scale.size > 1 else ())
    z = zp.astype(np.float32).reshape(shape if zp.size > 1 else ())
    value = ((w.astype(np.float32) - z) * s).astype(np.float32)
    return value if np.isfinite(value).all() else None


def _positions(model: onnx.ModelProto) -> dict[str, int]:
    """Static ``H * W`` of the 4-D tensors ONNX shape inference can tell."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # best effort: an unknown shape keeps the conv integer
        return {}
    found = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = v.type.tensor_type.shape.dim
        if len(dims) == 4 and all(d.HasField("dim_value") for d in dims[2:]):
            found[v.name] = dims[2].dim_value * dims[3].dim_value
    return found


def is_narrow(g: Graph, conv: onnx.NodeProto, w: np.ndarray, positions: int) -> bool:
    """A 2-D conv with fewer than :data:`NARROW_CHANNELS` output channels over at least
    :data:`MIN_POSITIONS` output positions (``positions``) whose output only a float
    activation reads (HardSwish also in its split form)."""
    if w.ndim != 4 or w.shape[0] >= NARROW_CHANNELS or positions < MIN_POSITIONS:
        return False
    out = conv.output[0]
    readers = g.consumers.get(out, [])
    if out in g.outputs or not readers:
        return False
    if len(readers) == 1:
        return readers[0].op_type in _FUSED_FLOAT_ACTS
    # HardSwish as ORT's basic optimisation splits it: Mul(x, HardSigmoid(x))
    kinds = sorted(r.op_type for r in readers)
    if kinds != ["HardSigmoid", "Mul"]:
        return False
    gate = next(r for r in readers if r.op_type == "HardSigmoid")
    mul = next(r for r in readers if r.op_type == "Mul")
    return sorted(mul.input) == sorted([out, gate.output[0]])


def float_narrow_convs(g: Graph) -> int:
    """Give the narrow convs of ``g`` (module doc) float weights; returns how many."""
    g.reindex()
    count = 0
    positions: dict[str, int] | None = None
    for conv in [n for n in g.graph.node if n.op_type == "Conv"]:
        dq = _weight_dq(g, conv)
        if dq is None or not conv.input or not _activation_dq(g, conv.input[0]):
            continue
        w = dequantized(g, dq)
        if w is None or w.ndim != 4 or w.shape[0] >= NARROW_CHANNELS:
            continue
        if positions is None:
            positions = _positions(g.model)
        if not is_narrow(g, conv, w, positions.get(conv.output[0], 0)):
            continue
        conv.input[1] = g.add_init(f"{conv.input[1]}_float", w)
        count += 1
    if count:
        g.finish()
    return count


__all__ = ["MIN_POSITIONS", "NARROW_CHANNELS", "dequantized", "float_narrow_convs", "is_narrow"]

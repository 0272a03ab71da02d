"""Complete ONNX Runtime's QDQ node units in a TensorRT-style Q/DQ graph, so its CPU provider
runs every conv, matmul, pooling, Add, Mul, Concat and Sigmoid on integer kernels.

TensorRT wants Q/DQ on the *inputs* of quantized layers only; ORT on x86 fuses
``DQ -> op -> Q`` groups: QLinearConv, QGemm, QLinearMatMul, QLinearAdd, QLinearMul,
QLinearConcat, QLinearSigmoid, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearLeakyRelu (a Relu, or a Clip ORT can prove redundant, may sit before the Q), and
drops ``DQ -> op -> Q`` around data-movement ops (MaxPool, Split, Slice, Transpose,
Reshape, Resize nearest, ...) when both sides share scale and zero-point. What ORT's own
``quantize_static`` writes (a Q/DQ pair on every tensor between such ops) shows what it
fuses; :func:`complete_units` gives our graph the same shape:

* every tensor that an integer-capable op reads or writes gets a Q/DQ: the existing one
  (other readers are moved onto its DQ), else a calibrated one (``ranges``), else one
  from the bound of the Clip that writes it or the largest scale of its neighbours;
* tensors joined by data-movement ops share one scale (the largest of their quantizers),
  so ORT can drop the Q/DQ around the op (exact: the op does not change values).

:func:`absorb_clips` then lets ``Conv -> Clip(0, H) -> Q`` (ReLU6) fuse: the Q becomes
uint8 with zero-point 0 and a scale whose 255 steps reach H at most, which clips exactly
where the Clip did (ORT drops it); when 255 steps of the calibrated scale already fit
below H the Clip is a Relu for ORT. Both change the output only beyond the calibrated
range or by the finer rounding of the uint8 grid (checked by the agreement check). On CPUs
whose u8s8 kernels saturate (:mod:`trtqat.engines.ort_u8s8`) the Q keeps its scale and a
uint8 ``Clip`` after it stops at 127 steps: the Q/DQ model's integers exactly, and values
the next dense conv can multiply by int8 weights without saturating.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from trtqat.engines.ort_qdq_graph import Graph, attr

log = logging.getLogger(__name__)

RangeFn = Callable[[list[str]], dict[str, float]]

MOVE_OPS = frozenset({"MaxPool", "Split", "Slice", "Transpose", "Reshape", "Flatten", "Squeeze",
                      "Unsqueeze", "DepthToSpace", "SpaceToDepth", "Gather", "Identity",
                      "Resize"})
UNARY_OPS = frozenset({"GlobalAveragePool", "AveragePool", "Sigmoid", "LeakyRelu"})
MULTI_OPS = frozenset({"Add", "Mul", "Concat"})
WEIGHTED_OPS = frozenset({"Conv", "Gemm", "MatMul"})
_TO_WEIGHT = frozenset({"Transpose", "Reshape", "Identity"})
# ORT runs these on integer kernels with a float output too (MatMulIntegerToFloat, QGemm
# with an int32 bias): their output is quantized only when its readers need it, which keeps
# the bias Add and scale Mul after a MatMul free for trtqat.engines.ort_qdq_matmul.
FLOAT_OUT_OPS = frozenset({"MatMul", "Gemm"})


class _Find:
    """Union-find over tensor names."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


class Units:
    """What ORT can fuse in ``g``: integer units, their data inputs and outputs, and the
    groups of tensors joined by data-movement ops."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        g.reindex()

    def const_like(self, name: str) -> bool:
        """A constant, or the DequantizeLinear of one."""
        g = self.g
        node = g.producer.get(name)
        return g.is_const(name) or (node is not None and node.op_type == "DequantizeLinear"
                                    and g.is_const(node.input[0]))

    def quantized_weight(self, name: str) -> bool:
        """``name`` is an INT8 weight: the DequantizeLinear of an int8/uint8 constant (FP8
        and INT4 weights make no integer unit: ORT runs them in float)."""
        node = self.g.producer.get(name)
        while node is not None and node.op_type in _TO_WEIGHT:
            node = self.g.producer.get(node.input[0])
        if node is None or node.op_type != "DequantizeLinear" or not self.g.is_const(
                node.input[0]):
            return False
        weight = self.g.const(node.input[0])
        return weight is None or weight.dtype in (np.int8, np.uint8)

    def data_inputs(self, node: onnx.NodeProto) -> list[str] | None:
        """The activation inputs of an integer-capable ``node``; None for other nodes."""
        op, ins = node.op_type, [i for i in node.input if i]
        if op in WEIGHTED_OPS and len(ins) >= 2:
            if self.const_like(ins[0]):
                return None
            if self.quantized_weight(ins[1]):
                return [ins[0]]
            if op == "MatMul" and not self.const_like(ins[1]):
                return ins[:2]
            return None
        if op in MULTI_OPS:
            return None if any(self.const_like(i) for i in ins) else ins
        if op in UNARY_OPS:
            return None if self.const_like(ins[0]) else ins[:1]
        return None

    def is_move(self, node: onnx.NodeProto) -> bool:
        if node.op_type not in MOVE_OPS or not node.input or self.const_like(node.input[0]):
            return False
        return node.op_type != "Resize" or attr(node, "mode", b"nearest") in (b"nearest",
                                                                                "nearest")

    def unit_output(self, node: onnx.NodeProto) -> str:
        """The output ORT quantizes: after a Relu or Clip(0, H) that only it feeds."""
        out = node.output[0]
        act = self.g.only_consumer(out)
        if act is not None and (act.op_type == "Relu" or clip_bounds(self.g, act) is not None):
            return act.output[0]
        return out

    def source(self, name: str) -> str:
        """The float tensor behind an activation DQ output (``name`` otherwise)."""
        dq = self.g.producer.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear" and not self.g.is_const(dq.input[0]):
            q = self.g.producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                return q.input[0]
        return name

    def activation_qs(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.g.consumers.get(name, []) if n.op_type == "QuantizeLinear"]

    def groups(self) -> _Find:
        """Tensors joined by data-movement ops (by their float source)."""
        find = _Find()
        for node in self.g.graph.node:
            if self.is_move(node):
                a = self.source(node.input[0])
                for out in node.output:
                    if out:
                        find.union(a, out)
        return find


def clip_bounds(g: Graph, node: onnx.NodeProto) -> tuple[float, float] | None:
    """``(0, H)`` of a ``Clip`` with constant bounds and lower bound 0, else None."""
    if node.op_type != "Clip":
        return None
    lo = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attr(node, "min")
    hi = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else attr(node, "max")
    if lo is None or hi is None or float(np.asarray(lo)) != 0.0 or not float(np.asarray(hi)) > 0:
        return None
    return 0.0, float(np.asarray(hi))


def _params(g: Graph, q: onnx.NodeProto) -> tuple[float, np.ndarray] | None:
    """Per-tensor (scale, zero-point array) of an 8-bit integer Q node with constant
    parameters (None for FP8 and the rest: their groups are left alone)."""
    scale = g.const(q.input[1])
    zp = g.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.array(0, np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1:
        return None
    if zp.dtype not in (np.int8, np.uint8) or attr(q, "output_dtype", 0) not in (
            0, onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
        return None
    return float(scale.reshape(())), zp


def _set_params(g: Graph, q: onnx.NodeProto, scale: float, zp_dtype) -> None:
    """Give ``q`` and its DQ readers ``scale`` and a zero-point 0 of ``zp_dtype``."""
    s, z = g.scalar(float(np.float32(scale)), np.float32), g.scalar(0, zp_dtype)
    q.input[1:] = [s, z]
    for dq in g.consumers.get(q.output[0], []):
        if dq.op_type == "DequantizeLinear":
            dq.input[1:] = [s, z]


def _dq_of(g: Graph, q: onnx.NodeProto) -> str:
    for dq in g.consumers.get(q.output[0], []):
        if dq.op_type == "DequantizeLinear" and dq.output[0] not in g.outputs:
            return dq.output[0]
    out = g.fresh(f"{q.input[0]}_dq")
    g.graph.node.append(helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:]], [out],
                                         name=g.fresh("DequantizeLinear")))
    return out


def _plan(u: Units) -> tuple[dict[str, list[str]], set[str], set[str], set[str]]:
    """Groups to quantize (root -> tensors), tensors whose every reader must take the
    DQ (integer unit outputs), the tensors read by integer or data-movement ops, and the
    integer units (by first output).

    Convs, Gemms and MatMuls with quantized weights are integer units; Add, Mul, Concat,
    pooling and Sigmoid only when one of their inputs is quantized already or comes from an
    integer unit (a transformer's residual Add of two float tensors stays float)."""
    g, find = u.g, u.groups()
    quantized = {n.input[0] for n in g.graph.node
                 if n.op_type == "QuantizeLinear" and not g.is_const(n.input[0])}
    needed, unit_outs, int_reads, units = set(quantized), set(), set(), set()
    for node in g.graph.node:
        ins = u.data_inputs(node)
        if ins is not None and node.op_type not in WEIGHTED_OPS and \
                not any(u.source(i) in quantized for i in ins):
            ins = None
        if ins is not None:
            units.add(node.output[0])
            int_reads.update(ins)
            needed.update(u.source(i) for i in ins)
            if node.op_type not in FLOAT_OUT_OPS:
                unit_outs.add(u.unit_output(node))
                quantized.add(u.unit_output(node))
        elif u.is_move(node):
            int_reads.add(node.input[0])
            if u.source(node.input[0]) in quantized:
                quantized.update(o for o in node.output if o)
    needed |= unit_outs
    active = {find.find(n) for n in sorted(needed)}  # sorted: find() records new names in order
    groups: dict[str, list[str]] = {}
    for name in list(find.parent) + sorted(needed - set(find.parent)):
        root = find.find(name)
        if root in active and name not in g.outputs and not u.const_like(name) \
                and name not in groups.get(root, []):
            groups.setdefault(root, []).append(name)
    return groups, unit_outs, int_reads, units


def _neighbour_scale(u: Units, names: list[str]) -> float | None:
    """Without calibration data: the largest quantizer scale among the other inputs and the
    output of the Add, Mul or Concat units that read or write ``names``."""
    g, scales = u.g, []
    for name in names:
        nodes = list(g.consumers.get(name, []))
        if name in g.producer:
            nodes.append(g.producer[name])
        for node in nodes:
            if node.op_type not in MULTI_OPS:
                continue
            others = [u.source(i) for i in node.input if i and i != name]
            others.append(u.unit_output(node))
            for other in others:
                for q in u.activation_qs(other):
                    p = _params(g, q)
                    if p is not None and other not in names:
                        scales.append(p[0])
    return max(scales) if scales else None


def _clip_bound(u: Units, names: list[str]) -> float | None:
    """H of a Clip(0, H) that writes one of ``names`` (the whole group is within [0, H])."""
    for name in names:
        node = u.g.producer.get(name)
        bounds = clip_bounds(u.g, node) if node is not None else None
        if bounds is not None:
            return bounds[1]
    return None


def complete_units(g: Graph, ranges: RangeFn | None, unify: bool = True) -> dict[str, int]:
    """Give every integer-capable op quantized inputs and outputs (module docstring).
    Returns counts of added, rescaled and rewired quantizers."""
    u = Units(g)
    groups, unit_outs, int_reads, units = _plan(u)
    counts: Counter[str] = Counter(dict.fromkeys(
        ("from_joined_quantizer", "calibrated", "from_clip_bound", "from_neighbours", "rescaled",
         "rewired"), 0))
    todo = [n for names in groups.values() if not any(u.activation_qs(x) for x in names)
            for n in names]
    amax = ranges(todo) if ranges is not None and todo else {}
    for names in groups.values():
        qs = [q for x in names for q in u.activation_qs(x)]
        params = [_params(g, q) for q in qs]
        if any(p is None or int(p[1].reshape(())) != 0 for p in params) or \
                len({p[1].dtype for p in params}) > 1:
            counts["groups_left_alone"] += 1  # zero-points other than 0: not TensorRT-style
            continue
        dtype = params[0][1].dtype if params else np.dtype(np.int8)
        if params:
            scale, how = max(p[0] for p in params), "from_joined_quantizer"
        elif all(x in amax for x in names):
            peak = 127.0 if dtype == np.int8 else 255.0
            scale, how = max(max(amax[x] for x in names), 1e-12) / peak, "calibrated"
        elif (bound := _clip_bound(u, names)) is not None:
            scale, how = bound / 127.0, "from_clip_bound"
        else:
            scale, how = _neighbour_scale(u, names), "from_neighbours"
            if scale is None:
                log.info("no range for %s: left in float", ", ".join(names))
                continue
        for name in names:
            existing = u.activation_qs(name)
            if existing:
                for q in existing:
                    if unify and _params(g, q)[0] != scale:
                        _set_params(g, q, scale, dtype)
                        counts["rescaled"] += 1
                target = _dq_of(g, existing[0])
            else:
                _, _, target = g.qdq(name, scale, 0, dtype)
                counts[how] += 1
            g.reindex()
            everyone = name in unit_outs
            for reader in list(g.consumers.get(name, [])):
                if reader.op_type == "QuantizeLinear" or reader.output[0] == target:
                    continue
                if everyone or (name in int_reads and (reader.output[0] in units
                                                       or u.is_move(reader))):
                    for k, i in enumerate(reader.input):
                        if i == name:
                            reader.input[k] = target
                    counts["rewired"] += 1
            g.reindex()
    g.finish()
    return dict(counts)


def _integer_clip(g: Graph, clip: onnx.NodeProto, qs: list[onnx.NodeProto], scale: float,
                  high: float) -> None:
    """Float ``Clip(0, H) -> Q(s)`` -> ``Q(uint8, s) -> Clip(0, min(127, round(H / s)))`` on
    uint8: the same integers as the reference (rounding is monotonic), at most 127 steps."""
    top = int(min(127, np.floor(high / scale + 0.5)))
    for q in qs:
        _set_params(g, q, scale, np.uint8)
    g.replace_uses(clip.output[0], clip.input[0])
    g.graph.node.remove(clip)
    g.reindex()
    first = g.consumers[clip.input[0]]
    q = next(n for n in first if n.op_type == "QuantizeLinear")
    clipped = g.fresh(f"{q.output[0]}_clip")
    readers = list(g.consumers.get(q.output[0], []))
    g.graph.node.append(helper.make_node(
        "Clip", [q.output[0], g.scalar(0, np.uint8), g.scalar(top, np.uint8)], [clipped],
        name=g.fresh("IntegerClip")))
    for reader in readers:
        for k, i in enumerate(reader.input):
            if i == q.output[0]:
                reader.input[k] = clipped
    g.reindex()


def absorb_clips(g: Graph, integer: bool = False) -> dict[str, int]:
    """``Clip(0, H) -> Q`` for ORT's fusion (module docstring): a Relu where 255 steps of the
    Q's scale stay below H, else no Clip and uint8 Qs of scale H / 255 on its output and on
    the tensors moved from it. ``integer`` (for CPUs whose u8s8 kernels saturate): the Q
    keeps its scale and a uint8 Clip after it keeps the values exact and within 127 steps."""
    u = Units(g)
    find = u.groups()
    counts: Counter[str] = Counter()
    for clip in [n for n in g.graph.node if n.op_type == "Clip"]:
        bounds = clip_bounds(g, clip)
        readers = g.consumers.get(clip.output[0], [])
        if bounds is None or not readers or clip.output[0] in g.outputs or \
                any(r.op_type != "QuantizeLinear" for r in readers):
            continue
        root = find.find(clip.output[0])
        group = [n for n in find.parent if find.find(n) == root] or [clip.output[0]]
        qs = [q for x in group for q in u.activation_qs(x)]
        params = [_params(g, q) for q in qs]
        if any(p is None or int(p[1].reshape(())) != 0 for p in params):
            continue
        high = bounds[1]
        if integer and len(readers) == 1 and len({p[0] for p in params}) == 1:
            _integer_clip(g, clip, qs, params[0][0], high)
            u = Units(g)
            find = u.groups()
            counts["integer_clip"] += 1
            continue
        if all(p[1].dtype == np.int8 and 255 * p[0] <= high * (1 + 1e-6) for p in params):
            clip.op_type = "Relu"  # never reached by the uint8 range: ORT drops the Relu
            del clip.input[1:]
            del clip.attribute[:]
            counts["to_relu"] += 1
            continue
        for q in qs:
            _set_params(g, q, high / 255.0, np.uint8)
        g.replace_uses(clip.output[0], clip.input[0])
        g.graph.node.remove(clip)
        g.reindex()
        counts["into_uint8_quantizer"] += 1
    g.finish()
    return dict(counts)


__all__ = ["MOVE_OPS", "Units", "absorb_clips", "clip_bounds", "complete_units"]

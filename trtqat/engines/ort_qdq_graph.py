"""A small mutable view of an ONNX graph for the CPU re-encoding passes of :mod:`ort_qdq`.

Producers, consumers and constants are looked up by tensor name; passes edit ``nodes`` in
place and call :meth:`Graph.reindex` afterwards; :meth:`Graph.finish` drops dead nodes and
initializers and sorts the nodes topologically.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Ops that move or select data without changing values: a Q/DQ pair commutes with them.
PASS_THROUGH = frozenset({"MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                          "Identity"})
# Ops whose output is non-negative when their (first) input is.
KEEPS_SIGN = PASS_THROUGH | {"GlobalAveragePool", "AveragePool", "GlobalMaxPool", "Resize",
                             "Split", "Slice", "Gather", "DepthToSpace", "SpaceToDepth"}


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of attribute ``name`` of ``node`` (``default`` when absent)."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def set_attr(node: onnx.NodeProto, name: str, value) -> None:
    """Set (or replace) attribute ``name`` of ``node``."""
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(helper.make_attribute(name, value))


class Graph:
    """Index of an ONNX graph: producers, consumers, constants; helpers to add tensors."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.inits: dict[str, onnx.TensorProto] = {t.name: t for t in self.graph.initializer}
        self.outputs = {o.name for o in self.graph.output}
        self._names = set(self.inits) | {i.name for i in self.graph.input}
        for n in self.graph.node:
            self._names.update(n.output)
        self._counter = itertools.count()
        self.reindex()

    # ----------------------------------------------------------------- lookups
    def reindex(self) -> None:
        """Rebuild the producer/consumer maps after nodes were edited."""
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.graph.node:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers[i].append(n)

    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or Constant node), else None."""
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            value = attr(node, "value")
            if value is not None:
                return numpy_helper.to_array(value)
        return None

    def is_const(self, name: str) -> bool:
        """True for initializers and Constant node outputs."""
        return name in self.inits or getattr(self.producer.get(name), "op_type", "") == "Constant"

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        """The single node reading ``name`` (None if several, none, or a graph output)."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        return users[0]

    # ----------------------------------------------------------------- additions
    def fresh(self, hint: str) -> str:
        """A tensor name not used yet, derived from ``hint``."""
        while True:
            name = f"{hint}_cpu{next(self._counter)}"
            if name not in self._names:
                self._names.add(name)
                return name

    def add_init(self, hint: str, value: np.ndarray) -> str:
        """Add an initializer with a fresh name; returns the name."""
        name = self.fresh(hint)
        tensor = numpy_helper.from_array(np.asarray(value), name)
        self.graph.initializer.append(tensor)
        self.inits[name] = tensor
        return name

    def scalar(self, value: float | int, dtype) -> str:
        """A (cached) scalar initializer of ``dtype``."""
        key = f"_scalar_{np.dtype(dtype).name}_{value!r}"
        cache = self.__dict__.setdefault("_scalars", {})
        if key not in cache:
            cache[key] = self.add_init(f"{np.dtype(dtype).name}_{value}", np.array(value, dtype))
        return cache[key]

    def qdq(self, src: str, scale: float, zero_point: int,
            dtype=np.uint8) -> tuple[onnx.NodeProto, onnx.NodeProto, str]:
        """New per-tensor QuantizeLinear + DequantizeLinear on ``src``; returns both and the
        DQ output name (not yet wired to any consumer)."""
        s = self.scalar(float(np.float32(scale)), np.float32)
        z = self.scalar(int(zero_point), dtype)
        q_out, dq_out = self.fresh(f"{src}_q"), self.fresh(f"{src}_dq")
        q = helper.make_node("QuantizeLinear", [src, s, z], [q_out], name=self.fresh("QuantizeLinear"))
        dq = helper.make_node("DequantizeLinear", [q_out, s, z], [dq_out],
                              name=self.fresh("DequantizeLinear"))
        self.graph.node.extend([q, dq])
        return q, dq, dq_out

    def replace_uses(self, old: str, new: str, skip: tuple[onnx.NodeProto, ...] = ()) -> None:
        """Make every reader of ``old`` (except ``skip``) read ``new``."""
        skipped = {tuple(s.output) for s in skip}
        for n in self.graph.node:
            if tuple(n.output) in skipped:
                continue
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new

    # ----------------------------------------------------------------- cleanup
    def finish(self) -> None:
        """Drop nodes and initializers nothing uses; sort the nodes topologically."""
        self.reindex()
        needed = set(self.outputs)
        keep: list[onnx.NodeProto] = []
        for n in reversed(_toposort(list(self.graph.node), self.inits, self.graph.input)):
            if any(o in needed for o in n.output):
                keep.append(n)
                needed.update(i for i in n.input if i)
        nodes = keep[::-1]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        unused = [t for t in self.graph.initializer if t.name not in needed]
        for t in unused:
            self.graph.initializer.remove(t)
            self.inits.pop(t.name, None)
        # shapes of rewritten tensors may have changed type; let ORT infer them again
        graph_io = {o.name for o in self.graph.output} | {i.name for i in self.graph.input}
        keep_vi = [v for v in self.graph.value_info if v.name in graph_io]
        del self.graph.value_info[:]
        self.graph.value_info.extend(keep_vi)
        self.reindex()


def _toposort(nodes: list[onnx.NodeProto], inits, inputs) -> list[onnx.NodeProto]:
    available = set(inits) | {i.name for i in inputs} | {""}
    producer_of = {o: k for k, n in enumerate(nodes) for o in n.output}
    missing = [sum(1 for i in n.input if i not in available and i in producer_of) for n in nodes]
    readers: dict[int, list[int]] = defaultdict(list)
    for k, n in enumerate(nodes):
        for i in n.input:
            if i not in available and i in producer_of:
                readers[producer_of[i]].append(k)
    ready = deque(k for k, m in enumerate(missing) if m == 0)
    order: list[int] = []
    while ready:
        k = ready.popleft()
        order.append(k)
        for r in readers[k]:
            missing[r] -= 1
            if missing[r] == 0:
                ready.append(r)
    if len(order) != len(nodes):
        raise RuntimeError("re-encoded graph has a cycle; this is a bug in trtqat.engines.ort_qdq")
    return [nodes[k] for k in order]


def elem_type(dtype) -> int:
    """ONNX element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


INT8, UINT8 = TensorProto.INT8, TensorProto.UINT8

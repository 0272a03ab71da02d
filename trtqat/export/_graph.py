"""Read-only index of an ONNX graph: producers, consumers and constant values."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper


class GraphIndex:
    """Who produces and who consumes each tensor of ``graph``, and which are constants."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(node)
        self.outputs = {o.name for o in graph.output}

    def is_constant(self, name: str) -> bool:
        """True for an initializer or the output of a Constant node."""
        if name in self.initializers:
            return True
        node = self.producer.get(name)
        return node is not None and node.op_type == "Constant"

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor, or None if it is computed at run time."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name == "value_float":
                    return np.array(attr.f, dtype=np.float32)
                if attr.name == "value_floats":
                    return np.array(list(attr.floats), dtype=np.float32)
        return None

    def produced_by(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The node producing ``name`` if it is of ``op_type``."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None


def attr(node: onnx.NodeProto, name: str, default=None):
    """Value of a node attribute, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def label(node: onnx.NodeProto) -> str:
    """How findings and errors name a node."""
    return f"{node.name or '<unnamed>'} ({node.op_type})"


def opset_version(model: onnx.ModelProto) -> int:
    """Version of the default ONNX domain."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0

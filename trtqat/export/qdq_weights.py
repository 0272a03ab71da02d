"""The exported Q/DQ graph's weights as int8 initializers (``Q(weight) -> DQ`` folded)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtqat.export._graph import GraphIndex, attr


def quantize_weights(model: onnx.ModelProto, min_codes: dict[str, int] | None = None) -> int:
    """Replace ``Q(float weight) -> DQ`` by an int8 weight initializer -> DQ (in place).

    The codes are computed once, as the PyTorch quantizer does (round half to even, clipped
    to [min, 127]: min is the quantizer's own, from ``min_codes`` by quantizer name, else
    -128 as the QuantizeLinear being replaced saturates); the file holds 1 byte per weight, and TensorRT reads DQ on
    int8 constants as quantized weights. Returns the number of weights converted.
    """
    graph = model.graph
    g = GraphIndex(graph)
    drop, count = set(), 0
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] not in g.initializers:
            continue
        users = g.consumers.get(node.output[0], [])
        scale = g.constant(node.input[1])
        if not users or any(u.op_type != "DequantizeLinear" for u in users) or scale is None:
            continue
        w = numpy_helper.to_array(g.initializers[node.input[0]]).astype(np.float32)
        if scale.size > 1:
            shape = [1] * w.ndim
            shape[attr(node, "axis", 1) % w.ndim] = -1
            scale = scale.reshape(shape)
        low = (min_codes or {}).get(node.name.split("/")[0], -128)
        codes = np.clip(np.rint(w / scale.astype(np.float32)), low, 127).astype(np.int8)
        name = f"{node.input[0]}_int8"
        graph.initializer.append(numpy_helper.from_array(codes, name))
        for u in users:
            u.input[0] = name
        drop.add(id(node))
        count += 1
    if drop:
        kept = [n for n in graph.node if id(n) not in drop]
        del graph.node[:]
        graph.node.extend(kept)
        used = {i for n in graph.node for i in n.input}
        live = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(live)
    return count

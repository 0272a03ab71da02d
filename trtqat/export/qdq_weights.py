"""The exported Q/DQ graph's weights as low-precision initializers (``Q(weight) -> DQ``
folded): int8 here, FP8 in :mod:`trtqat.export.fp8_qdq`, through :func:`fold_weight_qdq`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import numpy_helper

from trtqat.export._graph import GraphIndex, attr

# (QuantizeLinear, float weight, scale shaped to broadcast over it) -> the codes' initializer
WeightCodes = Callable[[onnx.NodeProto, NDArray[np.float32], NDArray[np.float32]],
                       onnx.TensorProto]


def fold_weight_qdq(model: onnx.ModelProto, codes: WeightCodes) -> int:
    """Replace every ``Q(float weight initializer) -> DQ`` by ``codes(...)`` -> DQ (in
    place): the QuantizeLinear goes, its DequantizeLinears read the new initializer. The
    replaced weights stay until :func:`drop_unused_initializers`. Returns how many."""
    graph = model.graph
    g = GraphIndex(graph)
    drop = set()
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] not in g.initializers:
            continue
        users = g.consumers.get(node.output[0], [])
        scale = g.constant(node.input[1])
        if not users or any(u.op_type != "DequantizeLinear" for u in users) or scale is None:
            continue
        w = numpy_helper.to_array(g.initializers[node.input[0]]).astype(np.float32)
        scale = scale.astype(np.float32)
        if scale.size > 1:
            shape = [1] * w.ndim
            shape[attr(node, "axis", 1) % w.ndim] = -1
            scale = scale.reshape(shape)
        tensor = codes(node, w, scale)
        graph.initializer.append(tensor)
        for u in users:
            u.input[0] = tensor.name
        drop.add(id(node))
    if drop:
        kept = [n for n in graph.node if id(n) not in drop]
        del graph.node[:]
        graph.node.extend(kept)
    return len(drop)


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Remove the initializers no node reads and no graph output names."""
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    live = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(live)


def quantize_weights(model: onnx.ModelProto, min_codes: dict[str, int] | None = None) -> int:
    """Replace ``Q(float weight) -> DQ`` by an int8 weight initializer -> DQ (in place).

    The codes are computed once, as the PyTorch quantizer does (round half to even, clipped
    to [min, 127]: min is the quantizer's own, from ``min_codes`` by quantizer name, else
    -128 as the QuantizeLinear being replaced saturates); the file holds 1 byte per weight, and TensorRT reads DQ on
    int8 constants as quantized weights. Returns the number of weights converted.
    """
    def int8_codes(node: onnx.NodeProto, w: NDArray[np.float32], scale: NDArray[np.float32]
                   ) -> onnx.TensorProto:
        low = (min_codes or {}).get(node.name.split("/")[0], -128)
        codes = np.clip(np.rint(w / scale), low, 127).astype(np.int8)
        return numpy_helper.from_array(codes, f"{node.input[0]}_int8")

    count = fold_weight_qdq(model, int8_codes)
    if count:
        drop_unused_initializers(model.graph)
    return count

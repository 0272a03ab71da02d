"""The int4 variants' weights: each folded INT4 weight initializer of the traced graph becomes
INT4 codes -> ``DequantizeLinear(axis, block_size)`` with float block scales (opset 21).

The exporter traces the model with every INT4 weight folded to its fake-quantized value
(:func:`trtqat.quant.blockwise.fold_block_weights`), which records each weight with its
float32 block scales. The graph's float initializer holding those values (the weight
``(out, in)`` a Gemm reads with ``transB=1``, or its transpose ``(in, out)`` a MatMul reads,
found by content, so renamed or pre-transposed initializers are found too) is replaced by
the codes ``rint(w / scale)`` (exact: ``w`` is ``code * scale`` in float32, which is what
ONNX Runtime's DequantizeLinear computes) and a DequantizeLinear whose output keeps the
initializer's name: blocks along the input channels, axis 1 of ``(out, in)`` or axis 0 of
``(in, out)``. A ``Transpose`` reading the weight alone is folded into the codes.
"""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtqat.export._graph import GraphIndex, attr
from trtqat.export.errors import ExportError

INT4_OPSET = 21  # DequantizeLinear with int4 inputs and block_size


def _key(array: np.ndarray) -> tuple:
    a = np.ascontiguousarray(array, dtype=np.float32)
    return a.shape, hashlib.sha1(a.tobytes()).hexdigest()


def _index(blocks: list[tuple[np.ndarray, np.ndarray, int]]) -> dict[tuple, tuple]:
    """Content key -> ``(codes, scales, axis, block_size, weight key)`` of each weight and
    of its transpose."""
    index: dict[tuple, tuple] = {}
    for weight, scales, block in blocks:
        weight = np.ascontiguousarray(weight, np.float32)
        full = np.repeat(scales.astype(np.float32), block, axis=1)
        codes = np.rint(weight / full)
        if not np.array_equal((codes.astype(np.float32) * full).astype(np.float32), weight) \
                or np.abs(codes).max(initial=0) > 7:
            raise ExportError("an INT4 weight is not code x scale in float32 (its quantizer "
                              "changed after folding): export the checkpoint again")
        codes = codes.astype(np.int8)
        key = _key(weight)
        index[key] = (codes, scales, 1, block, key)
        index.setdefault(_key(weight.T), (codes.T, scales.T, 0, block, key))
    return index


def _dq(name: str, codes: np.ndarray, scales: np.ndarray, axis: int, block: int
        ) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    inits = [numpy_helper.from_array(codes.astype(ml_dtypes.int4), f"{name}_int4"),
             numpy_helper.from_array(np.ascontiguousarray(scales, np.float32),
                                     f"{name}_int4_scale")]
    node = helper.make_node("DequantizeLinear", [i.name for i in inits], [name],
                            name=f"{name}/DequantizeLinear", axis=axis, block_size=block)
    return node, inits


def int4_initializers(model: onnx.ModelProto,
                      blocks: list[tuple[np.ndarray, np.ndarray, int]]) -> int:
    """Replace the float initializers holding folded INT4 weights (``blocks``: ``(weight,
    scales, block_size)`` each) by INT4 codes -> DequantizeLinear, in place (opset >= 21).
    Returns how many; a folded weight found nowhere in the graph is an :class:`ExportError`."""
    if not blocks:
        return 0
    graph = model.graph
    index = _index(blocks)
    g = GraphIndex(graph)
    found, new_nodes, new_inits, dropped = set(), [], [], set()
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or len(init.dims) != 2:
            continue
        hit = index.get(_key(numpy_helper.to_array(init)))
        if hit is None:
            continue
        codes, scales, axis, block, key = hit
        found.add(key)
        users = g.consumers.get(init.name, [])
        out = init.name
        if len(users) == 1 and users[0].op_type == "Transpose" \
                and list(attr(users[0], "perm", [1, 0])) == [1, 0]:
            codes, scales, axis, out = codes.T, scales.T, 1 - axis, users[0].output[0]
            dropped.add(id(users[0]))
        node, inits = _dq(out, codes, scales, axis, block)
        new_nodes.append(node)
        new_inits += inits
        dropped.add(init.name)
    missing = len({v[4] for v in index.values()} - found)
    if missing:
        raise ExportError(f"{missing} INT4 weight(s) were not found as initializers of the "
                          "traced graph (a weight computed at run time cannot be stored as "
                          "INT4): leave that layer float (skip_layers)")
    kept_inits = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits + new_inits)
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(new_nodes + kept)
    return len(new_nodes)

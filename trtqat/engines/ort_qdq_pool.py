"""Keep a ``DQ -> GlobalAveragePool -> Q`` in float where ONNX Runtime's integer kernel
refuses its scales.

ORT fuses every ``DQ -> GlobalAveragePool -> Q`` into a QLinearGlobalAveragePool, whose MLAS
kernel computes the requantization ``x_scale / (y_scale * N)`` (``N``: the pooled element
count, H*W) in float32 and throws "parameter out of computation range" at the first
inference when that is below 2**-32 or at least 256, or when ``N >= 2**24``. A MobileNetV2
calibrated on synthetic data has such a head: ReLU6's uint8 scale 6/255 into the pool and the
classifier's input quantizer, calibrated on features that all but vanish, at 7e-11 out of it.
:func:`float_pools_out_of_range` finds those pools before ORT does and turns them back into
``ReduceMean`` over the spatial axes, which ORT does not fuse: it runs in float between the
DQ and the Q (the Q/DQ model's values, as exported).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper

from trtqat.engines.ort_qdq_graph import Graph

log = logging.getLogger(__name__)

# MLAS's CheckQLinearGlobalAveragePoolScaleAndSize (onnxruntime/core/mlas/lib/qlgavgpool.cpp)
MIN_SCALE, MAX_SCALE, MAX_IMAGE_SIZE = 2.0 ** -32, 256.0, 1 << 24


def gap_scales_ok(x_scale: float, y_scale: float, image_size: int | None) -> bool:
    """True when ORT's QLinearGlobalAveragePool accepts these scales for ``image_size``
    pooled elements (None: unknown, every size from 1 to 2**24 - 1 must pass)."""
    if image_size is not None and not 0 < image_size < MAX_IMAGE_SIZE:
        return False
    ratio = np.float32(x_scale) / np.float32(y_scale) if y_scale > 0 else np.float32(np.inf)
    if not np.isfinite(ratio):
        return False
    sizes = (image_size,) if image_size is not None else (1, MAX_IMAGE_SIZE - 1)
    return all(MIN_SCALE <= float(np.float32(x_scale) / (np.float32(y_scale) * np.float32(n)))
               < MAX_SCALE for n in sizes)


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # best effort: unknown shapes are checked for every size
        inferred = model
    g = inferred.graph
    return {v.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in v.type.tensor_type.shape.dim]
            for v in list(g.input) + list(g.value_info) + list(g.output)
            if v.type.tensor_type.HasField("shape")}


def _scale(g: Graph, node: onnx.NodeProto) -> float | None:
    value = g.const(node.input[1]) if len(node.input) > 1 else None
    return float(value.reshape(())) if value is not None and value.size == 1 else None


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def float_pools_out_of_range(g: Graph) -> list[str]:
    """Turn each ``DQ -> GlobalAveragePool -> Q`` whose scales ORT's integer kernel refuses
    (:func:`gap_scales_ok`) into a float ``ReduceMean`` over the spatial axes (keepdims).
    Returns the names of the pools kept in float."""
    g.reindex()
    shapes: dict[str, list[int | None]] | None = None
    kept: list[str] = []
    for node in [n for n in g.graph.node if n.op_type == "GlobalAveragePool"]:
        dq = g.producer.get(node.input[0])
        readers = g.consumers.get(node.output[0], [])
        if dq is None or dq.op_type != "DequantizeLinear" or not readers or \
                any(r.op_type != "QuantizeLinear" for r in readers):
            continue  # not a unit ORT fuses
        x_scale = _scale(g, dq)
        y_scales = [_scale(g, q) for q in readers]
        if x_scale is None or any(s is None for s in y_scales):
            continue
        if shapes is None:
            shapes = _shapes(g.model)
        dims = shapes.get(node.input[0])
        spatial = dims[2:] if dims is not None and len(dims) >= 3 else None
        size = int(np.prod(spatial)) if spatial and all(spatial) else None
        if all(gap_scales_ok(x_scale, s, size) for s in y_scales):
            continue
        if dims is None or len(dims) < 3:
            log.warning("%s: ORT's QLinearGlobalAveragePool refuses its scales, and its rank "
                        "is unknown: left as it is", node.name or node.output[0])
            continue
        axes = list(range(2, len(dims)))
        name = node.name or g.fresh("ReduceMean")
        if _opset(g.model) >= 18:
            axes_name = g.add_init(f"{name}_axes", np.array(axes, np.int64))
            new = helper.make_node("ReduceMean", [node.input[0], axes_name], list(node.output),
                                   name=name, keepdims=1)
        else:
            new = helper.make_node("ReduceMean", [node.input[0]], list(node.output), name=name,
                                   axes=axes, keepdims=1)
        idx = list(g.graph.node).index(node)
        g.graph.node.remove(node)
        g.graph.node.insert(idx, new)
        kept.append(name)
        log.info("%s: scales %.3g -> %s over %s elements are outside ORT's "
                 "QLinearGlobalAveragePool range: pooled in float", name, x_scale,
                 ", ".join(f"{s:.3g}" for s in y_scales), size or "unknown")
    if kept:
        g.finish()
    return kept


__all__ = ["float_pools_out_of_range", "gap_scales_ok"]

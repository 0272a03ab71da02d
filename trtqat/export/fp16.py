"""Convert an ONNX graph's float parts to fp16 (what TensorRT 11 builds as FP16).

Float initializers, constants, casts and intermediate tensors become fp16. Graph inputs and
outputs stay fp32 with a Cast after/before them (``io_dtype="float32"``, the default) or
become fp16. Q/DQ scales become fp16 too, which ONNX allows from opset 19 on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtqat.export._graph import attr, opset_version
from trtqat.export.errors import ExportError

log = logging.getLogger(__name__)

FP16_MAX = float(np.finfo(np.float16).max)
FP16_TINY = float(2.0 ** -24)  # smallest fp16 subnormal
FP16_NORMAL = float(np.finfo(np.float16).tiny)

IO_DTYPES = {"float32": TensorProto.FLOAT, "fp32": TensorProto.FLOAT,
             "float16": TensorProto.FLOAT16, "fp16": TensorProto.FLOAT16}

# (op, input index) that ONNX requires in float32 whatever the data type.
_KEEP_FP32 = {("Resize", 2), ("Upsample", 1)}


def _to_fp16(array: np.ndarray, is_scale: bool) -> np.ndarray:
    if np.abs(array).max(initial=0.0) > FP16_MAX:
        log.warning("a constant exceeds the fp16 range (%g); it is clipped to +-%g",
                    float(np.abs(array).max()), FP16_MAX)
    out = np.clip(array, -FP16_MAX, FP16_MAX)
    if is_scale:
        small = int(np.count_nonzero(out < FP16_NORMAL))
        if small:
            log.info("%d Q/DQ scale(s) below fp16's normal range lose precision", small)
        out = np.maximum(out, FP16_TINY)
    return out.astype(np.float16)


def check_io_dtype(io_dtype: str) -> None:
    """Raise :class:`ExportError` unless ``io_dtype`` is one of :data:`IO_DTYPES` (checked
    for every variant, though only fp16 variants use it)."""
    if not isinstance(io_dtype, str) or io_dtype not in IO_DTYPES:
        raise ExportError(f"io_dtype (--io-dtype) {io_dtype!r} is unknown: use one of "
                          f"{', '.join(IO_DTYPES)}")


def convert_to_fp16(model: onnx.ModelProto, io_dtype: str = "float32",
                    float32_ops: Sequence[str] = ()) -> onnx.ModelProto:
    """A copy of ``model`` computing in fp16; inputs/outputs in ``io_dtype``.

    Nodes whose op type is in ``float32_ops`` (e.g. ``LayerNormalization``, ``Softmax``:
    a family's fp16-sensitive ops) keep computing in float32 between Casts, and the weights
    only they read stay float32: TensorRT 11 builds those layers in FP32.
    """
    check_io_dtype(io_dtype)
    io_type = IO_DTYPES[io_dtype]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node)
    if has_qdq and opset_version(out) < 19:
        raise ExportError(f"fp16 Q/DQ scales need opset >= 19 (the model has "
                          f"{opset_version(out)}); export int8-fp16 with --opset 19")
    keep32: set[str] = set()
    scales: set[str] = set()
    for node in graph.node:
        for idx, name in enumerate(node.input):
            if (node.op_type, idx) in _KEEP_FP32:
                keep32.add(name)
            if node.op_type in ("QuantizeLinear", "DequantizeLinear") and idx == 1:
                scales.add(name)

    kept = set(float32_ops)
    float_names = _float32_tensors(model) if kept else set()
    own32 = _read_only_by(graph, kept) & float_names
    keep32 |= own32
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT and init.name not in keep32:
            arr = _to_fp16(numpy_helper.to_array(init), init.name in scales)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, init.name))
    for node in graph.node:
        if node.op_type not in kept:
            _convert_node(node, scales)
    if kept:
        _wrap_float32_nodes(graph, kept, float_names, own32)

    _convert_io(graph, io_type)
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(out, strict_mode=True)


def _float32_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of the float32 tensors of ``model`` (by ONNX type inference)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    names = {t.name for t in g.initializer if t.data_type == TensorProto.FLOAT}
    for v in [*g.input, *g.value_info, *g.output]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            names.add(v.name)
    for node in g.node:  # Constant outputs may be missing from value_info
        if node.op_type == "Constant" and any(a.name == "value" and a.t.data_type ==
                                              TensorProto.FLOAT for a in node.attribute):
            names.add(node.output[0])
    return names


def _read_only_by(graph: onnx.GraphProto, ops: set[str]) -> set[str]:
    """Initializers that only nodes of ``ops`` read."""
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    return {t.name for t in graph.initializer if readers.get(t.name) and readers[t.name] <= ops}


def _wrap_float32_nodes(graph: onnx.GraphProto, ops: set[str], float_names: set[str],
                        own32: set[str]) -> None:
    """Give every node of ``ops`` float32 inputs and outputs: a Cast from fp16 (shared by
    the readers of a tensor) in front, a Cast back to fp16 under the original name behind
    (dropped when only float32 nodes read it). Chained float32 nodes pass float32 along."""
    as32: dict[str, str] = {}  # tensor -> its float32 version
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type not in ops:
            nodes.append(node)
            continue
        for i, name in enumerate(node.input):
            if not name or name not in float_names or name in own32:
                continue
            if name not in as32:
                as32[name] = f"{name}/float32"
                nodes.append(helper.make_node("Cast", [name], [as32[name]],
                                              name=f"{name}/CastFloat32", to=TensorProto.FLOAT))
            node.input[i] = as32[name]
        after = []
        for i, name in enumerate(node.output):
            if not name or name not in float_names:
                continue
            node.output[i] = as32[name] = f"{name}/float32"
            after.append(helper.make_node("Cast", [as32[name]], [name],
                                          name=f"{name}/CastFloat16", to=TensorProto.FLOAT16))
        nodes += [node, *after]
    read = {name for n in nodes for name in n.input} | {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(n for n in nodes if not (n.name.endswith("/CastFloat16")
                                               and n.output[0] not in read))


def _convert_node(node: onnx.NodeProto, scales: set[str]) -> None:
    if node.op_type == "Cast" and attr(node, "to") == TensorProto.FLOAT:
        for a in node.attribute:
            if a.name == "to":
                a.i = TensorProto.FLOAT16
    elif node.op_type in ("Constant", "ConstantOfShape"):
        if node.op_type == "ConstantOfShape" and not any(a.name == "value"
                                                         for a in node.attribute):
            # no value: float32 zeros (torch.zeros, Swin's attention mask) become fp16 ones
            node.attribute.append(helper.make_attribute(
                "value", numpy_helper.from_array(np.zeros(1, np.float16))))
            return
        for a in node.attribute:
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                arr = _to_fp16(numpy_helper.to_array(a.t), node.output[0] in scales)
                a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))
            elif a.name in ("value_float", "value_floats"):
                raise ExportError(f"Constant {node.name} uses {a.name}; cannot convert to fp16")


def _convert_io(graph: onnx.GraphProto, io_type: int) -> None:
    """Graph inputs/outputs to fp16, or kept fp32 with a Cast after/before each."""
    initializers = {t.name for t in graph.initializer}
    head = [_cast_boundary(graph, v, io_type, False) for v in graph.input
            if v.name not in initializers]
    tail = [_cast_boundary(graph, v, io_type, True) for v in graph.output]
    head, tail = [n for n in head if n is not None], [n for n in tail if n is not None]
    nodes = head + list(graph.node) + tail
    del graph.node[:]
    graph.node.extend(nodes)


def _cast_boundary(graph: onnx.GraphProto, value: onnx.ValueInfoProto, io_type: int,
                   is_output: bool) -> onnx.NodeProto | None:
    """A float32 graph input/output of the fp16 graph: float16 itself (fp16 I/O), or kept
    float32 with the Cast between it and the graph returned (renaming its uses)."""
    ttype = value.type.tensor_type
    if ttype.elem_type != TensorProto.FLOAT:
        return None
    if io_type == TensorProto.FLOAT16:
        ttype.elem_type = TensorProto.FLOAT16
        return None
    inner = f"{value.name}_fp16"
    for node in graph.node:
        for names in ((node.input, node.output) if is_output else (node.input,)):
            for i, name in enumerate(names):
                if name == value.name:
                    names[i] = inner
    if is_output:
        return helper.make_node("Cast", [inner], [value.name], name=f"{value.name}/Cast",
                                to=TensorProto.FLOAT)
    return helper.make_node("Cast", [value.name], [inner], name=f"{value.name}/Cast",
                            to=TensorProto.FLOAT16)


def clip_to_fp16_range(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose float constants beyond fp16's range are clipped to it.

    An additive attention mask fills padding with float32's lowest value; in fp16 that is
    -65504, still far below any score, so the softmax is unchanged. Clipping first keeps
    :func:`convert_to_fp16` from warning about it on every export.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    tensors = list(out.graph.initializer) + [
        a.t for n in out.graph.node if n.op_type == "Constant" for a in n.attribute
        if a.name == "value"]
    for t in tensors:
        if t.data_type != TensorProto.FLOAT:
            continue
        arr = numpy_helper.to_array(t)
        if arr.size and np.abs(arr).max() > FP16_MAX:
            t.CopyFrom(numpy_helper.from_array(np.clip(arr, -FP16_MAX, FP16_MAX), t.name))
    return out

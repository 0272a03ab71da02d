"""Move an exported graph to the requested opset (the exporter itself writes opset 18)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import onnx

from trtqat.export._graph import GraphIndex
from trtqat.export._torch_export import EXPORT_OPSET, quiet
from trtqat.export.errors import ExportError

log = logging.getLogger(__name__)


def convert_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` at ``opset``: onnx's version converter, else a direct retarget.

    The converter lacks some downgrade adapters (e.g. Relu 14 -> 13, a type-only change);
    then the opset import is rewritten and each node fitted to its older schema.
    """
    current = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    if current == opset:
        return model
    try:
        with quiet():
            converted = onnx.version_converter.convert_version(model, opset)
    except Exception as exc:
        log.debug("version converter %d -> %d failed (%s); retargeting", current, opset, exc)
        converted = _retarget(model, opset)
    if opset < 18:
        _drop_default_attrs(converted, opset)
    return converted


_REDUCE_AXES_INPUT = 18  # Reduce* ops (but ReduceSum, 13) take axes as an input from 18


def _retarget(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = GraphIndex(out.graph)
    for node in out.graph.node:
        reduce = node.op_type.startswith("Reduce") and node.op_type != "ReduceSum"
        if reduce and opset < _REDUCE_AXES_INPUT and len(node.input) > 1 and node.input[1]:
            axes = g.constant(node.input[1])
            if axes is None:
                raise ExportError(f"{node.name} has run-time axes, which opset {opset} cannot "
                                  f"express; use --opset {_REDUCE_AXES_INPUT}")
            del node.input[1:]
            node.attribute.append(onnx.helper.make_attribute("axes", [int(a) for a in axes]))
    for imp in out.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset
    return out


_RESIZE_DEFAULTS = {("antialias", 0), ("keep_aspect_ratio_policy", b"stretch")}


def _drop_default_attrs(model: onnx.ModelProto, opset: int) -> None:
    """Remove attributes the target schema does not know, where that changes nothing.

    ``noop_with_empty_axes=0`` is the older behaviour; ``Split(num_outputs=n)`` (opset 18,
    e.g. ShuffleNet's channel split) becomes a Split with explicit sizes; Resize drops
    ``antialias=0`` and ``keep_aspect_ratio_policy="stretch"`` (an upsample's defaults); ``Reshape(allowzero=1)`` only differs
    from older Reshape when its shape holds a 0.
    """
    g = GraphIndex(model.graph)
    for node in model.graph.node:
        try:
            known = set(onnx.defs.get_schema(node.op_type, opset, node.domain).attributes)
        except onnx.defs.SchemaError:
            continue
        kept = []
        for a in node.attribute:
            value = onnx.helper.get_attribute_value(a)
            if a.name in known:
                kept.append(a)
            elif a.name == "noop_with_empty_axes" and value == 0:
                continue
            elif a.name == "num_outputs" and node.op_type == "Split":
                if len(node.input) > 1 and node.input[1]:
                    continue  # explicit sizes given: num_outputs only repeats their count
                _split_sizes(model, node, int(value))
            elif node.op_type == "Resize" and (a.name, value) in _RESIZE_DEFAULTS:
                continue  # opset 18's defaults: the older Resize computes the same
            elif a.name == "allowzero" and node.op_type == "Reshape":
                shape = g.constant(node.input[1])
                if value == 0 or (shape is not None and 0 not in shape.tolist()):
                    continue
                raise ExportError(f"{node.name} reshapes with zeros (allowzero), which opset "
                                  f"{opset} cannot express; use --opset 14 or later")
            elif _is_newer_default(node, a):
                continue  # e.g. Resize(keep_aspect_ratio_policy="stretch"), opset 18's default
            else:
                kept.append(a)
        del node.attribute[:]
        node.attribute.extend(kept)


def _is_newer_default(node: onnx.NodeProto, a: onnx.AttributeProto) -> bool:
    """``a`` holds the default value the exporter's own opset gives it (so leaving it out
    at an older opset changes nothing)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, EXPORT_OPSET, node.domain)
    except onnx.defs.SchemaError:
        return False
    attr = schema.attributes.get(a.name)
    if attr is None or not attr.default_value.name:
        return False
    return onnx.helper.get_attribute_value(attr.default_value) == \
        onnx.helper.get_attribute_value(a)


def first_problem(model: onnx.ModelProto) -> str | None:
    """The first reason ``model`` is not valid ONNX at its opset (None when it is)."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        return (str(exc).strip().splitlines() or ["invalid"])[0][:200]
    return None


def lowest_working_opset(build: Callable[[int], onnx.ModelProto], opset: int
                         ) -> tuple[onnx.ModelProto, int, list[str]]:
    """``build(opset)``, or ``build`` at the lowest higher opset (up to the exporter's own)
    whose graph is valid ONNX, with a note saying why."""
    asked, first = opset, None
    while True:
        model = build(opset)
        problem = first_problem(model) if opset < EXPORT_OPSET else None
        if problem is None:
            break
        first = first or problem
        opset += 1
    if opset == asked:
        return model, opset, []
    note = (f"exported at opset {opset}, the lowest that expresses this graph (at opset "
            f"{asked}: {first})")
    log.warning("NOTE %s", note)
    return model, opset, [note]


def _split_sizes(model: onnx.ModelProto, node: onnx.NodeProto, parts: int) -> None:
    """Give a ``Split(num_outputs=parts)`` its sizes as an input (opset 13-17 form).

    Opset 18 splits into ``ceil(dim / parts)`` chunks, the last one smaller; older opsets
    without sizes split evenly, so the sizes are written out when the dim is known.
    """
    axis = next((onnx.helper.get_attribute_value(a) for a in node.attribute
                 if a.name == "axis"), 0)
    dim = _static_dim(model, node.input[0], axis)
    if dim is None:
        return  # no sizes: an even split into len(outputs) parts (ORT checks it)
    chunk = -(-dim // parts)
    sizes = [min(chunk, dim - i * chunk) for i in range(parts)]
    name = f"{node.name or node.output[0]}_split_sizes"
    model.graph.initializer.append(
        onnx.numpy_helper.from_array(np.asarray(sizes, dtype=np.int64), name))
    del node.input[1:]
    node.input.append(name)


def _static_dim(model: onnx.ModelProto, tensor: str, axis: int) -> int | None:
    """The size of ``tensor`` along ``axis`` if the graph records it."""
    for info in [*model.graph.value_info, *model.graph.input]:
        if info.name == tensor:
            dims = info.type.tensor_type.shape.dim
            if dims and dims[axis % len(dims)].HasField("dim_value"):
                return int(dims[axis % len(dims)].dim_value)
    return None

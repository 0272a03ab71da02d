"""FP8 E4M3 Q/DQ in the ONNX file: the traced graph's Q/DQ given FLOAT8E4M3FN zero points.

An FP8 quantizer traces as torch's int8 fake-quantize op with its FP8 scale
(:func:`trtqat.quant.export_mode.fp8_for_export`); :func:`to_fp8_qdq` then turns every
QuantizeLinear/DequantizeLinear of the graph into FP8 (opset 19+): the zero point becomes a
FLOAT8E4M3FN 0 of the same shape, the scale and axis stay. A model mixing INT8 and FP8
quantizers is refused before tracing (:func:`quantizer_format`).

Weights (``fp8_weights``), both built by TensorRT 10+ (explicit quantization reads a DQ on
a low-precision constant as pre-quantized weights, and quantizes a Q/DQ'd float weight at
build time):

* ``compressed`` (default): the weight is an FP8 initializer read by a DequantizeLinear, 1
  byte per weight (the form ModelOpt writes for FP8 weights); its codes are
  :func:`trtqat.quant.fp8.quantize_e4m3` of the PyTorch weight, as the quantizer computes
  them.
* ``qdq``: the float32 weight stays, with QuantizeLinear -> DequantizeLinear (4 bytes per
  weight; for tools that want the float weight in the file).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from trtqat.export._graph import GraphIndex
from trtqat.export.errors import ExportError
from trtqat.export.qdq_weights import drop_unused_initializers, fold_weight_qdq
from trtqat.quant.descriptor import E4M3
from trtqat.quant.fp8 import quantize_e4m3
from trtqat.quant.model_ops import quantizers

FP8_WEIGHTS = ("compressed", "qdq")
DEFAULT_FP8_WEIGHTS = "compressed"
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def check_fp8_weights(value: object) -> str:
    """``value`` if it is one of :data:`FP8_WEIGHTS`, else an :class:`ExportError`."""
    if value not in FP8_WEIGHTS:
        raise ExportError(f"fp8_weights (--fp8-weights) {value!r} is unknown: use "
                          f"{' or '.join(FP8_WEIGHTS)}")
    return str(value)


def quantizer_format(model: nn.Module) -> str | None:
    """``"int8"``, ``"fp8"`` or ``"int4"``: the format of ``model``'s active quantizers
    (None: none).

    A model holding two is an :class:`ExportError`: one file holds one format."""
    from trtqat.quant.blockwise import is_block

    kinds: dict[str, str] = {}
    for name, q in quantizers(model):
        if q.disabled or not q._if_quant:
            continue
        kind = "fp8" if q.num_bits == E4M3 else "int4" if is_block(q) else "int8"
        kinds.setdefault(kind, name)
    if len(kinds) > 1:
        found = " and ".join(f"{k.upper()} ('{n}')" for k, n in kinds.items())
        raise ExportError(f"the model mixes {found} quantizers, which one ONNX file cannot "
                          "hold (mixed formats are not supported): quantize it again with one "
                          "format (--format int8, fp8 or int4)")
    return next(iter(kinds), None)


def check_variant_format(model: nn.Module, variant: str, fmt: str | None) -> None:
    """Refuse a quantized ``variant`` of format ``fmt`` from a model quantized in another."""
    have = quantizer_format(model)
    if fmt is None or have is None or have == fmt:
        return
    raise ExportError(f"the model is quantized in {have.upper()}, so it has no {variant} "
                      f"variant: export {have}, {have}-fp16, fp32 or fp16 (or quantize it "
                      f"again with --format {fmt})")


def _fp8_zero(graph: onnx.GraphProto, shape: tuple[int, ...], made: dict) -> str:
    """The name of a FLOAT8E4M3FN zero initializer of ``shape`` (one per shape)."""
    if shape not in made:
        name = "fp8_zero" + "".join(f"_{d}" for d in shape)
        size = int(np.prod(shape)) if shape else 1
        graph.initializer.append(helper.make_tensor(name, TensorProto.FLOAT8E4M3FN,
                                                    list(shape), bytes(size), raw=True))
        made[shape] = name
    return made[shape]


def _fp8_codes(node: onnx.NodeProto, weight: np.ndarray, scale: np.ndarray
               ) -> onnx.TensorProto:
    """``QuantizeLinear(weight, scale)`` in E4M3 (``scale`` shaped to broadcast), as the
    PyTorch quantizer computes it."""
    w = torch.from_numpy(np.array(weight, dtype=np.float32))  # a writable copy
    s = torch.from_numpy(np.array(scale, dtype=np.float32))
    codes = quantize_e4m3(w, s).contiguous().view(torch.uint8).numpy()
    return helper.make_tensor(f"{node.input[0]}_fp8", TensorProto.FLOAT8E4M3FN,
                              list(codes.shape), codes.tobytes(), raw=True)


def to_fp8_qdq(model: onnx.ModelProto, weights: str = DEFAULT_FP8_WEIGHTS) -> int:
    """Make every Q/DQ of ``model`` FP8 E4M3 (in place); ``weights``: :data:`FP8_WEIGHTS`.

    Returns the number of Q/DQ nodes converted."""
    check_fp8_weights(weights)
    graph = model.graph
    g = GraphIndex(graph)
    made: dict[tuple[int, ...], str] = {}
    count = 0
    codes = set()  # QuantizeLinear outputs: now E4M3 tensors
    for node in graph.node:
        if node.op_type not in _QDQ:
            continue
        if node.op_type == "QuantizeLinear":
            codes.add(node.output[0])
        zp = g.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        shape = tuple(zp.shape) if zp is not None else ()
        name = _fp8_zero(graph, shape, made)
        if len(node.input) > 2:
            node.input[2] = name
        else:
            node.input.append(name)
        count += 1
    for info in graph.value_info:
        if info.name in codes:
            info.type.tensor_type.elem_type = TensorProto.FLOAT8E4M3FN
    if weights == "compressed":  # Q(float weight) -> DQ becomes an FP8 initializer -> DQ
        fold_weight_qdq(model, _fp8_codes)
    drop_unused_initializers(graph)
    return count

"""Which quantized formats an ONNX file holds (int8, fp8, int4), read from its Q/DQ types.

Both backends and the reports use it: the TensorRT builder sets the builder flags a format
needs (TensorRT 10), the ONNX Runtime builder says which formats it only emulates on the
CPU, and every engine header records ``quant_formats`` and ``precision`` (named like the
export variants: ``int8``, ``fp8-fp16``, ``int4-fp16``, ``fp32``...).

A QuantizeLinear/DequantizeLinear counts by the element type of its zero point; without a
zero point, a DequantizeLinear by its quantized input (an initializer or Constant: INT4
weights, ModelOpt's "compressed" FP8 weights) and a QuantizeLinear by ``output_dtype``
(default uint8, i.e. int8).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import onnx
from onnx import TensorProto

log = logging.getLogger(__name__)

FORMAT_ORDER = ("int8", "fp8", "int4")
_FORMAT_OF_TYPE = {
    TensorProto.INT8: "int8", TensorProto.UINT8: "int8",
    TensorProto.FLOAT8E4M3FN: "fp8", TensorProto.FLOAT8E4M3FNUZ: "fp8",
    TensorProto.FLOAT8E5M2: "fp8", TensorProto.FLOAT8E5M2FNUZ: "fp8",
    TensorProto.INT4: "int4", TensorProto.UINT4: "int4",
}
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# what ONNX Runtime's CPU provider does with each format (the build's NOTE line)
_CPU_NOTES = {
    "fp8": "FP8 Q/DQ run emulated in float32 by ONNX Runtime on the CPU: accuracy is FP8's, "
           "speed is not (FP8 kernels need TensorRT on an FP8 GPU)",
    "int4": "INT4 block weights run emulated by ONNX Runtime on the CPU (dequantized to float "
            "before a float MatMul): accuracy is INT4's, speed is not",
    "int4_nbits": "INT4 block weights run on ONNX Runtime's MatMulNBits kernel ({n} MatMul) "
                  "with float activations on the CPU: accuracy is INT4's; the speed is this "
                  "CPU's, not a GPU's",
}


def _const_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every initializer and Constant output (by tensor name)."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    types[node.output[0]] = a.t.data_type
    return types


def _node_type(node: onnx.NodeProto, types: Mapping[str, int]) -> int | None:
    """The quantized element type of one Q or DQ node (None: not known from the file)."""
    if len(node.input) > 2 and node.input[2]:
        return types.get(node.input[2])
    if node.op_type == "DequantizeLinear":
        return types.get(node.input[0])
    for a in node.attribute:
        if a.name == "output_dtype" and a.i:
            return int(a.i)
    return TensorProto.UINT8  # QuantizeLinear's default output type


def quant_formats(model: onnx.ModelProto) -> tuple[str, ...]:
    """The quantized formats ``model`` holds, in :data:`FORMAT_ORDER` (() for a float model).

    Only the main graph is read (trtqat's exports keep Q/DQ there)."""
    types = _const_types(model)
    found = set()
    for node in model.graph.node:
        if node.op_type in _QDQ_OPS and node.domain in ("", "ai.onnx"):
            fmt = _FORMAT_OF_TYPE.get(_node_type(node, types) or 0)
            if fmt:
                found.add(fmt)
    return tuple(f for f in FORMAT_ORDER if f in found)


def precision_name(formats: tuple[str, ...] | list[str], float16: bool) -> str:
    """``("fp8",), True`` -> ``'fp8-fp16'``; ``(), False`` -> ``'fp32'``; two formats are
    joined with ``+`` (``'int8+fp8'``), as the export variants name them."""
    if not formats:
        return "fp16" if float16 else "fp32"
    return "+".join(formats) + ("-fp16" if float16 else "")


def cpu_format_notes(header: Mapping[str, Any]) -> list[str]:
    """The NOTE lines of an ONNX Runtime engine run by the CPU provider alone that holds FP8
    or INT4: which of them it emulates in float, and where INT4 runs on MatMulNBits."""
    formats = header.get("quant_formats") or ()
    providers = [str(p) for p in header.get("providers") or ()]
    if not providers or any(p != "CPUExecutionProvider" for p in providers):
        return []
    notes = []
    if "fp8" in formats:
        notes.append(_CPU_NOTES["fp8"])
    if "int4" in formats:
        summary = header.get("compute_nodes") or {}
        nbits = sum(int(n) for op, n in (summary.get("float_ops") or {}).items()
                    if op == "MatMulNBits")
        nbits += sum(int(n) for op, n in (summary.get("integer_ops") or {}).items()
                     if op == "MatMulNBits")
        notes.append(_CPU_NOTES["int4_nbits"].format(n=nbits) if nbits else _CPU_NOTES["int4"])
    return notes


def log_format_notes(header: Mapping[str, Any], logger: logging.Logger | None = None) -> None:
    """Log :func:`cpu_format_notes` as ``NOTE`` warnings (one line each)."""
    for note in cpu_format_notes(header):
        (logger or log).warning("NOTE %s", note)


__all__ = ["FORMAT_ORDER", "cpu_format_notes", "log_format_notes", "precision_name",
           "quant_formats"]

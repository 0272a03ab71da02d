"""Reading ONNX files for the engine builders, with one-line errors for bad files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from trtqat.engines.errors import ModelFileError
from trtqat.engines.specs import TensorSpec
from trtqat.finite import check_finite_arrays, onnx_initializers


def read_onnx_bytes(path: str | os.PathLike[str]) -> bytes:
    """The raw bytes of an ONNX file, or ModelFileError when it is missing or empty."""
    p = Path(path)
    if p.is_dir():
        raise ModelFileError(f"{p} is a folder, not an ONNX file; give the .onnx file itself")
    if not p.is_file():
        raise ModelFileError(f"ONNX file {p} does not exist; export one with 'trtqat export'")
    data = p.read_bytes()
    if not data:
        raise ModelFileError(f"ONNX file {p} is empty; export it again with 'trtqat export'")
    return data


def load_onnx(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load and check an ONNX model; a missing, truncated or non-ONNX file is a user error."""
    p = Path(path)
    read_onnx_bytes(p)
    try:
        model = onnx.load(str(p))
    except Exception as exc:  # protobuf raises DecodeError/RuntimeError on non-ONNX bytes
        raise ModelFileError(f"{p} is not an ONNX model (truncated or another format: "
                             f"{type(exc).__name__}); export it again with 'trtqat export'"
                             ) from None
    if model.ir_version <= 0 or not model.graph.node:
        raise ModelFileError(f"{p} is not an ONNX model (no IR version or no graph nodes); "
                             "export it again with 'trtqat export'")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"{p} is not a valid ONNX model ({first}); "
                             "export it again with 'trtqat export'") from None
    check_finite_arrays(onnx_initializers(model), f"ONNX model {p}",
                        "no engine built; export it from a finite checkpoint")
    return model


def _value_spec(value: onnx.ValueInfoProto, where: str) -> TensorSpec:
    if not value.type.HasField("tensor_type"):
        raise ModelFileError(f"{where} '{value.name}' is not a tensor; engines take tensors only")
    ttype = value.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
    except (KeyError, TypeError, ValueError):
        raise ModelFileError(f"{where} '{value.name}' has an unsupported element type "
                             f"{ttype.elem_type}") from None
    if not ttype.HasField("shape"):
        raise ModelFileError(f"{where} '{value.name}' has no shape; export the ONNX with shapes")
    shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim)
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def onnx_input_specs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    """The graph's real inputs (initializers listed as inputs are left out)."""
    inits = {init.name for init in model.graph.initializer}
    return tuple(_value_spec(v, "input") for v in model.graph.input if v.name not in inits)


def onnx_output_specs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    """The graph's outputs, dynamic dimensions as None."""
    return tuple(_value_spec(v, "output") for v in model.graph.output)


_INDEX_PASS_THROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})


def index_input_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Integer graph inputs used as row indices of a constant table (token ids into an
    embedding: ``Gather(table, ids)``, possibly after Cast/Reshape, or ORT's fused
    ``EmbedLayerNormalization``) -> the table's row count, so random feeds stay in range."""
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    bounds: dict[str, int] = {}
    for value in model.graph.input:
        if value.name in inits or value.type.tensor_type.elem_type not in (
                onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            continue
        todo, seen, found = [value.name], set(), []
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in users.get(name, []):
                if node.op_type == "Gather" and list(node.input[1:2]) == [name] \
                        and node.input[0] in inits:
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    found.append(inits[node.input[0]][axis])
                elif node.op_type == "EmbedLayerNormalization":
                    table = {0: 2, 1: 4}.get(list(node.input).index(name))
                    if table is not None and len(node.input) > table and node.input[table] in inits:
                        found.append(inits[node.input[table]][0])
                elif node.op_type in _INDEX_PASS_THROUGH:
                    todo.extend(node.output)
        if found:
            bounds[value.name] = int(min(found))
    return bounds


def has_float16(model: onnx.ModelProto) -> bool:
    """True when ``model`` holds float16 initializers or casts to float16."""
    fp16 = onnx.TensorProto.FLOAT16
    if any(t.data_type == fp16 for t in model.graph.initializer):
        return True
    return any(n.op_type == "Cast" and any(a.name == "to" and a.i == fp16 for a in n.attribute)
               for n in model.graph.node)


# ORT graph optimizers that crash (ORT 1.32: a segfault building the session, at the default
# "all" level) on float16 graphs they do not speed up: the CPU NCHWc layout transformer on
# the exporter's fp16 nn.MultiheadAttention pattern.
FP16_UNSAFE_ORT_OPTIMIZERS = ("NchwcTransformer",)
# ORT's Q/DQ fusions, disabled for a float16 Q/DQ graph that ORT cannot load with them: ORT
# 1.32 fuses DQ -> Concat -> Q into QLinearConcat whatever the scales' type, and rejects its
# own node when they are float16 (the INT8+FP16 variant of any model with quantized Concats)
FP16_QDQ_FUSIONS = "QDQSelectorActionTransformer"


# ORT 1.32's level-2 rules drop a Relu in front of an FP8 QuantizeLinear with zero point 0, as
# if FP8 were unsigned like uint8 (its ReluQuantFusion; the rule cannot be disabled alone):
# the negative half then reaches the FP8 Q and the output is wrong (measured: a Conv ->
# Relu -> Q/DQ(fp8) -> Conv graph off by more than its output range). Off for FP8 graphs.
FP8_UNSAFE_ORT_OPTIMIZERS = ("Level2_RuleBasedTransformer",)
# ORT 1.32's level-1 WeightBiasQuantization turns a float Conv/Gemm bias after DQ inputs into
# int32 codes at scale x_scale * w_scale, computed in the graph's float type: with float16
# scales the quotient overflows float16 (FP8's amax / 448 scales, or small INT8 ones) and the
# bias becomes garbage (measured: a digits ResNet18's qat-fp8-fp16 file at 10% top-1, against
# 95.8% as written; int8-fp16 off by 1.17 in the logits); with FP8 it rounds a bias that
# TensorRT keeps in float. Off for FP8 and for float16 Q/DQ graphs.
BIAS_QUANTIZATION = "WeightBiasQuantization"


def ort_disabled_optimizers(model: onnx.ModelProto) -> list[str]:
    """The ORT optimizers to disable for ``model``: :data:`FP16_UNSAFE_ORT_OPTIMIZERS` for a
    float16 graph, :data:`FP8_UNSAFE_ORT_OPTIMIZERS` for one with FP8 Q/DQ, and
    :data:`BIAS_QUANTIZATION` for both when they hold Q/DQ."""
    from trtqat.engines.qformats import quant_formats

    formats = quant_formats(model)
    float16 = has_float16(model)
    disabled = list(FP16_UNSAFE_ORT_OPTIMIZERS) if float16 else []
    if "fp8" in formats:
        disabled += FP8_UNSAFE_ORT_OPTIMIZERS
    if "fp8" in formats or (float16 and formats):
        disabled.append(BIAS_QUANTIZATION)
    return disabled

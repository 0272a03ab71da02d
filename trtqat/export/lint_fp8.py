"""The lint's FP8 E4M3 rules (Q/DQ whose zero point is FLOAT8E4M3FN), used by
:mod:`trtqat.export.lint`; INT8 Q/DQ keep the INT8 rules.

What TensorRT runs in FP8 (explicit quantization, TensorRT 10/11 developer guide
"Working with Quantized Types" and the "Explicit Quantization" Q/DQ fusion rules; ModelOpt's
FP8 ONNX placement follows them): the matrix products, i.e. Conv/ConvTranspose, Gemm and
MatMul with FP8 Q/DQ on the data input and on the weights (weights per tensor or per output
channel), the two operands of attention's MatMuls (Q.K^T, P.V), and a residual Add whose
identity input carries a Q/DQ (fused into the convolution's epilogue); Q/DQ move across
data movement (Reshape, Transpose, Slice, Concat, MaxPool, ...). Everything else (pooling
that averages, normalization, Softmax, GELU, element-wise math) runs in FP16/FP32: an FP8
Q/DQ in front of it only adds a rounding, so it is worth a warning (``no-fp8-form``), not an
error. Activation scales are per tensor (the INT8 rule ``activation-per-channel`` applies),
and one file should hold one format (``mixed-formats``). A convolution with 16 or fewer
input or output channels (an RGB stem) has no FP8 kernel worth it: TensorRT 10.2 found no
FP8 implementation of ResNet's first convolution (NVIDIA/TensorRT issue 3987) and ModelOpt
leaves convolutions with <= 16 channels out of FP8 (``fp8-small-conv``, a warning).
"""

from __future__ import annotations

import numpy as np
import onnx

from trtqat.export.lint_scales import readers

# Ops an FP8 DequantizeLinear may feed: FP8 matrix products, the residual Add, and the data
# movement TensorRT moves Q/DQ across.
FP8_CAPABLE = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Reshape", "Flatten", "Transpose",
    "Squeeze", "Unsqueeze", "Identity", "Slice", "Split", "Gather", "Concat", "Pad", "Expand",
    "Tile", "Shape", "MaxPool", "GlobalMaxPool", "QuantizeLinear", "DequantizeLinear",
})

def zero_point_kind(linter, node: onnx.NodeProto) -> str | None:
    """``"fp8"``, ``"int8"`` (or another integer type's name) for a Q/DQ's constant zero
    point; None when it has none."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    zp = linter.g.constant(node.input[2])
    if zp is None:
        return None
    return "fp8" if is_fp8(zp) else str(zp.dtype)


def is_fp8(array: np.ndarray) -> bool:
    """True for an E4M3 array (as onnx reads a FLOAT8E4M3FN tensor)."""
    return str(array.dtype) == "float8_e4m3fn"


def check_fp8_users(linter, dq: onnx.NodeProto, layer: str) -> None:
    """Warn on each op reading the FP8 activation ``dq`` that TensorRT cannot run in FP8."""
    for user, _ in readers(linter.g.consumers, dq.output[0]):
        if user.op_type in FP8_CAPABLE:
            continue
        linter.add("no-fp8-form", "warning", user, f"{user.op_type} reads the FP8 output of "
                   f"{dq.name or 'a DequantizeLinear'} but TensorRT runs it in FP16/FP32, so "
                   f"the Q/DQ only adds a rounding; leave layer '{layer}' in float "
                   f"(--skip-layers {layer})")


SMALL_CONV_CHANNELS = 16  # ModelOpt's threshold: <= 16 input or output channels stay float


def check_fp8_conv(linter, node: onnx.NodeProto) -> None:
    """Warn on an FP8 Conv with <= :data:`SMALL_CONV_CHANNELS` input or output channels."""
    dq = linter._dq(node.input[1]) if len(node.input) > 1 else None
    if dq is None or zero_point_kind(linter, dq) != "fp8":
        return
    shape = linter._weight_shape(dq)
    if shape is None or len(shape) < 3:
        return
    groups = int(next((a.i for a in node.attribute if a.name == "group"), 1))
    c_in, c_out = shape[1] * groups, shape[0]
    if min(c_in, c_out) <= SMALL_CONV_CHANNELS:
        layer = _layer(node.name)
        linter.add("fp8-small-conv", "warning", node, f"FP8 Conv with {c_in} input and "
                   f"{c_out} output channels: TensorRT's FP8 convolution kernels want more "
                   f"than {SMALL_CONV_CHANNELS}, so it runs slower than in FP16; leave layer "
                   f"'{layer}' in float (--skip-layers {layer})")


def _layer(name: str) -> str:
    return name.split("/")[0] if "/" in name else name


def check_mixed_formats(linter) -> None:
    """One warning when the graph's Q/DQ use both INT8 and FP8 zero points."""
    kinds: dict[str, onnx.NodeProto] = {}
    for node in linter.model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            kind = zero_point_kind(linter, node)
            if kind in ("fp8", "int8"):
                kinds.setdefault(kind, node)
    if len(kinds) == 2:
        linter.add("mixed-formats", "warning", "<graph>", f"INT8 Q/DQ ({kinds['int8'].name}) "
                   f"and FP8 Q/DQ ({kinds['fp8'].name}) in one file: TensorRT reformats "
                   "between them; export one format (trtqat quantizes with one --format)")

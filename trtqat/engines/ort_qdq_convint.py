"""Quantized convolutions whose output stays float (a head feeding a graph output, a conv
read by float ops) -> ``ConvInteger`` + float rescale, for ONNX Runtime's CPU provider.

ORT fuses ``DQ(x) -> Conv <- DQ(w)`` into ``QLinearConv`` only when a ``QuantizeLinear``
reads the Conv's output; without one it runs the Conv in float on dequantized inputs,
although TensorRT runs the same Q/DQ pattern as an INT8 convolution with a float output.
:func:`integer_float_output_convs` gives ORT the same: ``ConvInteger(q_x, q_w)`` (int32,
exact), ``Cast`` to float, one ``Mul`` by ``s_x * s_w`` per output channel, and the bias
``Add``. The result equals the float Conv on the dequantized inputs up to float rounding.

Depthwise convs stay as they are (ORT has no fast depthwise ConvInteger). Only uint8
per-tensor activations (after ``reencode_uint8``) and weights with one zero-point (per-tensor or
per-output-channel scales) qualify: ORT's ``ConvInteger`` takes one weight zero-point.
Weights are stored as uint8 (+128, exact), see :func:`_rewrite`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtqat.engines.ort_qdq_graph import Graph, attr

# a Relu / Clip after the Conv is fused by ORT into QLinearConv when a Q reads its output
_FUSED_ACTIVATIONS = ("Relu", "Clip")


def _dq_params(g: Graph, name: str) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray] | None:
    """``(DequantizeLinear, scale, zero_point)`` behind tensor ``name``, constants only."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or attr(dq, "block_size", 0):
        return None
    scale = g.const(dq.input[1])
    zp = g.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.array(0, np.uint8)
    if scale is None or zp is None:
        return None
    return dq, scale, zp


def _output_quantized(g: Graph, out: str) -> bool:
    """True when a QuantizeLinear reads ``out`` or the output of a Relu/Clip it alone feeds
    (ORT then fuses the Conv into QLinearConv itself)."""
    readers = g.consumers.get(out, [])
    if any(r.op_type == "QuantizeLinear" for r in readers):
        return True
    if len(readers) == 1 and out not in g.outputs and readers[0].op_type in _FUSED_ACTIVATIONS:
        return _output_quantized(g, readers[0].output[0])
    return False


def _channel_shape(rank: int, channels: int) -> tuple[int, ...]:
    return (1, channels) + (1,) * (rank - 2)


def _rewrite(g: Graph, conv: onnx.NodeProto) -> bool:
    x, w = _dq_params(g, conv.input[0]), _dq_params(g, conv.input[1]) if len(conv.input) > 1 else None
    if x is None or w is None or g.is_const(x[0].input[0]) or not g.is_const(w[0].input[0]):
        return False
    (x_dq, s_x, zp_x), (w_dq, s_w, zp_w) = x, w
    weight = g.const(w_dq.input[0])
    if s_x.size != 1 or zp_x.size != 1 or zp_x.dtype != np.uint8:
        return False
    if weight.dtype not in (np.int8, np.uint8) or np.any(zp_w != zp_w.reshape(-1)[0]):
        return False
    if attr(conv, "group", 1) > 1 and weight.shape[1] == 1:
        return False  # depthwise: ORT's ConvInteger ran 2.7x slower than its float Conv here
    channels = weight.shape[0]
    if s_w.size not in (1, channels) or (s_w.size > 1 and attr(w_dq, "axis", 1) != 0):
        return False
    bias = g.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if len(conv.input) > 2 and conv.input[2] and (bias is None or bias.size != channels):
        return False
    if _output_quantized(g, conv.output[0]):
        return False
    rank = weight.ndim
    name = conv.name or "conv"
    # uint8 weights (+128, exact): measured on AVX2 (no VNNI), ORT's u8u8 ConvInteger ran
    # 1.3x faster than the float Conv and its int8-weight path 3.5x slower than u8u8; u8s8
    # kernels can also saturate there. VNNI CPUs: unmeasured.
    shift = 128 if weight.dtype == np.int8 else 0
    w_u8 = g.add_init(f"{name}_w_u8", (weight.astype(np.int16) + shift).astype(np.uint8))
    zp_w_scalar = g.scalar(int(zp_w.reshape(-1)[0]) + shift, np.uint8)
    scale = (s_x.astype(np.float64).reshape(()) * s_w.astype(np.float64).reshape(-1))
    scale = np.broadcast_to(scale, (channels,)).astype(np.float32).reshape(_channel_shape(rank, channels))
    acc, as_float = g.fresh(f"{name}_int32"), g.fresh(f"{name}_float")
    scaled = g.fresh(f"{name}_scaled") if bias is not None else conv.output[0]
    nodes = [
        helper.make_node("ConvInteger", [x_dq.input[0], w_u8, x_dq.input[2]
                                         if len(x_dq.input) > 2 and x_dq.input[2]
                                         else g.scalar(0, np.uint8), zp_w_scalar],
                         [acc], name=g.fresh(f"{name}_ConvInteger"),
                         **{a.name: helper.get_attribute_value(a) for a in conv.attribute}),
        helper.make_node("Cast", [acc], [as_float], to=TensorProto.FLOAT,
                         name=g.fresh(f"{name}_Cast")),
        helper.make_node("Mul", [as_float, g.add_init(f"{name}_rescale", scale)], [scaled],
                         name=g.fresh(f"{name}_Rescale")),
    ]
    if bias is not None:
        b = bias.astype(np.float32).reshape(_channel_shape(rank, channels))
        nodes.append(helper.make_node("Add", [scaled, g.add_init(f"{name}_bias", b)],
                                      [conv.output[0]], name=g.fresh(f"{name}_Bias")))
    g.graph.node.remove(conv)
    g.graph.node.extend(nodes)
    return True


def integer_float_output_convs(g: Graph) -> int:
    """Rewrite every qualifying quantized Conv with a float output (see the module
    docstring); returns how many were rewritten."""
    count = 0
    g.reindex()
    for conv in [n for n in g.graph.node if n.op_type == "Conv"]:
        if _rewrite(g, conv):
            count += 1
            g.reindex()  # only a rewrite changes producers and consumers
    g.finish()
    return count

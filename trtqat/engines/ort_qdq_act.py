"""Pointwise activations of a TensorRT-style Q/DQ graph on ONNX Runtime's integer kernels:
HardSigmoid, HardSwish (MobileNetV3's activations and squeeze-excitation gates) and
LeakyRelu (CSPNet, YOLO).

TensorRT fuses ``Conv -> act -> Q`` into one INT8 convolution, so the exported graph has no
quantizer on the conv's output. ORT fuses a conv into QLinearConv only when a Q reads its
output, and has no integer kernel for HardSigmoid or HardSwish: as exported, each such conv
ran as ConvInteger + float rescale, its activation in float, with NCHW/NHWC Transposes around
them (MobileNetV3-Small: 74 float vs 71 integer compute nodes, 36 Transposes).
:func:`integer_activations` rewrites, before the output quantizers are completed
(:func:`trtqat.engines.ort_qdq_units.complete_units`):

* ``HardSigmoid(x) = clip(alpha * x + beta, 0, 1)`` -> ``Q(x)``, then a QLinearAdd of
  ``DQ(q_x)`` read with ``alpha`` times its scale (the same integers are ``alpha * x``) and
  the constant ``beta``, into a uint8 quantizer of scale 1/255, zero-point 0, whose range
  ``[0, 1]`` is the clip (the kernel saturates exactly there);
* ``HardSwish(x) = x * HardSigmoid(x)`` (alpha 1/6, beta 1/2) -> the same, then a
  QLinearMul of ``DQ(q_x)`` and the gate into the existing output quantizer;
* ``LeakyRelu`` (0 <= alpha < 1) whose output is quantized with ``amax`` A -> a symmetric
  quantizer on its input of the same A, so ORT fuses the conv and QLinearLeakyRelu.

The quantizer on ``x`` needs a range, which the exported graph does not have. It is taken
where the activation makes a wider one useless, narrowed by a bound on what the producing
conv can output (:func:`conv_bound`: sum of |W| times its input's range plus |bias|, per
channel): HardSigmoid is constant outside ``[-beta / alpha, (1 - beta) / alpha]``
([-3, 3]); HardSwish is 0 below -3 and its output quantizer clips above the ``x`` whose
HardSwish is A (without a bound, its negative side goes no further than its positive one);
LeakyRelu's positive side clips at A, and a negative ``x`` below -A moves the
output by ``alpha`` times the excess only. With calibration inputs, their max ``|x|`` narrows
it too. The rounding this adds (the gate on a 1/255 grid,
``x`` on its own grid) is what the agreement check of
:func:`trtqat.engines.ort_qdq.reencode_for_cpu` measures; ``faithful`` re-encodings skip
this pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from trtqat.engines.ort_qdq_graph import Graph, attr
from trtqat.engines.ort_qdq_units import MOVE_OPS

RangeFn = Callable[[list[str]], dict[str, float]]

HARD_OPS = {"HardSigmoid": None, "HardSwish": (1.0 / 6.0, 0.5)}  # None: from the attributes
_THROUGH = MOVE_OPS - {"Resize", "Gather"}  # values pass unchanged (a subset of them)
GATE_SCALE = 1.0 / 255.0  # uint8, zero-point 0: exactly [0, 1]


def _qparams(g: Graph, node: onnx.NodeProto) -> tuple[float, np.ndarray] | None:
    """Per-tensor (scale, zero-point) of a Q/DQ node with constant, finite parameters."""
    scale = g.const(node.input[1]) if len(node.input) > 1 else None
    zp = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.array(0, np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or zp.dtype.kind not in "iu":
        return None  # per-channel, or not an integer grid (float8)
    value = float(scale.reshape(()))
    if not math.isfinite(value) or value <= 0:
        return None
    return value, zp


def _span(scale: float, zp: np.ndarray) -> tuple[float, float]:
    """The real range ``(lo, hi)`` a quantizer's integer grid covers."""
    info, z = np.iinfo(zp.dtype), float(zp.reshape(()))
    return (info.min - z) * scale, (info.max - z) * scale


def _output_amax(g: Graph, name: str, depth: int = 4) -> float | None:
    """The largest value the activation quantizers reading ``name`` represent, directly or
    through data-movement ops and Concat (whose quantizer covers each input)."""
    highs = []
    for reader in g.consumers.get(name, []):
        if reader.op_type == "QuantizeLinear":
            p = _qparams(g, reader)
            high = None if p is None else _span(*p)[1]
        elif reader.op_type in _THROUGH and reader.input[0] == name or \
                reader.op_type == "Concat":
            high = _output_amax(g, reader.output[0], depth - 1) if depth else None
        else:
            continue
        if high is None:
            return None
        highs.append(high)
    return max(highs) if highs else None


def _input_q(g: Graph, name: str) -> tuple[str, float, np.ndarray] | None:
    """``(q output, scale, zero-point)`` when ``name`` is the DQ of an activation Q."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or g.is_const(dq.input[0]):
        return None
    p = _qparams(g, dq)
    return None if p is None else (dq.input[0], *p)


def conv_bound(g: Graph, name: str) -> float | None:
    """An upper bound of ``|name|`` when a Conv or Gemm with a quantized input and quantized
    constant weights writes it (per output channel: sum |W| * input range + |bias|)."""
    node = g.producer.get(name)
    if node is None or node.op_type not in ("Conv", "Gemm") or len(node.input) < 2:
        return None
    if node.op_type == "Gemm" and (attr(node, "transA", 0) or attr(node, "alpha", 1.0) != 1.0
                                   or attr(node, "beta", 1.0) != 1.0):
        return None
    x = _input_q(g, node.input[0])
    w_dq = g.producer.get(node.input[1])
    if x is None or w_dq is None or w_dq.op_type != "DequantizeLinear":
        return None
    w, scale = g.const(w_dq.input[0]), g.const(w_dq.input[1])
    zp = g.const(w_dq.input[2]) if len(w_dq.input) > 2 and w_dq.input[2] else np.zeros(1)
    if w is None or scale is None or zp is None or w.ndim < 2:
        return None
    axis = attr(w_dq, "axis", 1) % w.ndim
    if scale.size not in (1, w.shape[axis]) or zp.size not in (1, w.shape[axis]):
        return None
    real = (w.astype(np.float64) - _along(zp, axis, w.ndim)) * _along(scale, axis, w.ndim)
    if node.op_type == "Gemm" and not attr(node, "transB", 0):
        real = real.T  # [K, N] -> [N, K]
    lo, hi = _span(x[1], x[2])
    per_channel = np.abs(real.reshape(real.shape[0], -1)).sum(axis=1) * max(abs(lo), abs(hi))
    if len(node.input) > 2 and node.input[2]:
        bias = g.const(node.input[2])
        if bias is None or bias.size not in (1, per_channel.size):
            return None
        per_channel = per_channel + np.abs(bias.astype(np.float64).reshape(-1))
    bound = float(per_channel.max())
    return bound if math.isfinite(bound) else None


def _along(value: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-tensor or per-axis quantization parameter, shaped to broadcast along ``axis``."""
    shape = [1] * ndim
    if value.size > 1:
        shape[axis] = -1
    return value.astype(np.float64).reshape(shape)


def _bound(g: Graph, name: str, measured: dict[str, float]) -> float | None:
    """The tighter of :func:`conv_bound` and the calibrated max |value| of ``name``."""
    found = [b for b in (conv_bound(g, name), measured.get(name))
             if b is not None and math.isfinite(b) and b > 0]
    return min(found) if found else None


def _hard_range(op: str, alpha: float, beta: float, amax: float | None,
                bound: float | None) -> tuple[float, float] | None:
    """The range of ``x`` to quantize before a HardSigmoid/HardSwish (module docstring)."""
    lo, hi = -beta / alpha, (1.0 - beta) / alpha
    if op == "HardSwish":
        if amax is None or amax <= 0:
            return None
        # x * (x + 3) / 6 = amax below 3, x = amax above
        hi = amax if amax >= 3.0 else 12.0 * amax / (3.0 + math.sqrt(9.0 + 24.0 * amax))
        if bound is None:  # nothing known of the negative side: as wide as the positive one
            lo = max(lo, -hi)
    if bound is not None:
        lo, hi = max(lo, -bound), min(hi, bound)
    # a float32 scale of at least 1e-30: no underflow to 0 (nor a subnormal grid)
    return (lo, hi) if math.isfinite(hi - lo) and (hi - lo) / 255.0 >= 1e-30 else None


def _quantize_input(g: Graph, x: str, lo: float, hi: float) -> tuple[str, float, np.ndarray]:
    """A uint8 Q of ``x`` covering ``[lo, hi]`` (``lo`` <= 0 <= ``hi``); returns its output,
    scale and zero-point."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = float(np.float32((hi - lo) / 255.0))
    zp = np.array(int(np.clip(math.ceil(-lo / scale - 1e-6), 0, 255)), np.uint8)
    out = g.fresh(f"{x}_q")
    g.graph.node.append(helper.make_node(
        "QuantizeLinear", [x, g.scalar(scale, np.float32), g.scalar(int(zp), np.uint8)], [out],
        name=g.fresh("QuantizeLinear")))
    return out, scale, zp


def _dq(g: Graph, q_out: str, scale: float, zp: np.ndarray, out: str | None = None) -> str:
    out = out or g.fresh(f"{q_out}_dq")
    g.graph.node.append(helper.make_node(
        "DequantizeLinear", [q_out, g.scalar(float(np.float32(scale)), np.float32),
                             g.scalar(int(zp.reshape(())), zp.dtype)], [out],
        name=g.fresh("DequantizeLinear")))
    return out


def _gate_worth_it(g: Graph, node: onnx.NodeProto) -> bool:
    """A HardSigmoid whose output is quantized or scales a quantized tensor (an SE gate)."""
    for reader in g.consumers.get(node.output[0], []):
        if reader.op_type == "QuantizeLinear":
            return True
        if reader.op_type == "Mul":
            others = [i for i in reader.input if i != node.output[0]]
            if any(_input_q(g, i) is not None or any(
                    r.op_type == "QuantizeLinear" for r in g.consumers.get(i, []))
                    for i in others):
                return True
    return False


def _float_layer(g: Graph, name: str) -> bool:
    """``name`` is the output of a Conv/Gemm with float constant weights."""
    node = g.producer.get(name)
    return node is not None and node.op_type in ("Conv", "Gemm") and len(node.input) > 1 \
        and g.is_const(node.input[1])


def _rewrite_hard(g: Graph, node: onnx.NodeProto, bound: float | None,
                  counts: Counter) -> None:
    op, x, out = node.op_type, node.input[0], node.output[0]
    alpha, beta = HARD_OPS[op] or (float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5)))
    if alpha <= 0 or beta <= 0 or g.is_const(x) or out in g.outputs:
        return
    if _float_layer(g, x):
        return  # ORT fuses the activation into the float conv; a Q on x would unfuse it
    amax = _output_amax(g, out)
    if (op == "HardSwish" and amax is None) or (op == "HardSigmoid" and not _gate_worth_it(g, node)):
        return
    quantized = _input_q(g, x)
    if quantized is None:
        span = _hard_range(op, alpha, beta, amax, bound)
        if span is None:
            counts["left_in_float"] += 1
            return
        quantized = _quantize_input(g, x, *span)
    q_x, s_x, zp_x = quantized
    scaled = _dq(g, q_x, s_x * alpha, zp_x)
    offset = _dq(g, g.scalar(1, np.uint8), beta, np.array(0, np.uint8))
    gate_f = g.fresh(f"{out}_gate")
    g.graph.node.append(helper.make_node("Add", [scaled, offset], [gate_f], name=g.fresh("Add")))
    gate_q = g.fresh(f"{out}_gate_q")
    zero = np.array(0, np.uint8)
    g.graph.node.append(helper.make_node(
        "QuantizeLinear", [gate_f, g.scalar(float(np.float32(GATE_SCALE)), np.float32),
                           g.scalar(0, np.uint8)], [gate_q], name=g.fresh("QuantizeLinear")))
    if op == "HardSigmoid":
        _dq(g, gate_q, GATE_SCALE, zero, out)
    else:
        gate = _dq(g, gate_q, GATE_SCALE, zero)
        g.graph.node.append(helper.make_node("Mul", [_dq(g, q_x, s_x, zp_x), gate], [out],
                                             name=node.name or g.fresh("Mul")))
    g.graph.node.remove(node)
    counts[op] += 1


def _quantize_leaky_input(g: Graph, node: onnx.NodeProto, bound: float | None,
                          counts: Counter) -> None:
    x, alpha = node.input[0], float(attr(node, "alpha", 0.01))
    if not 0 <= alpha < 1 or g.is_const(x) or _input_q(g, x) is not None or _float_layer(g, x):
        return
    if any(r.op_type == "QuantizeLinear" for r in g.consumers.get(x, [])):
        return  # quantized already: complete_units wires it
    amax = _output_amax(g, node.output[0])
    if amax is None or amax <= 0:
        return
    amax = min(amax, bound) if bound else amax
    _, _, dq = g.qdq(x, amax / 127.0, 0, np.int8)
    node.input[0] = dq
    counts["LeakyRelu"] += 1


def _fuse_split_hardswish(g: Graph) -> int:
    """Put ``Mul(x, HardSigmoid(x))`` with HardSwish's constants back into one HardSwish:
    ORT's basic optimisation (run first on graphs with quantized MatMuls) splits it, and
    a split gate would stay float. Returns how many (none below opset 14, which has no
    HardSwish)."""
    if max((o.version for o in g.model.opset_import if o.domain in ("", "ai.onnx")),
           default=0) < 14:
        return 0
    fused = 0
    for hs in [n for n in g.graph.node if n.op_type == "HardSigmoid"]:
        alpha, beta = float(attr(hs, "alpha", 0.2)), float(attr(hs, "beta", 0.5))
        readers = g.consumers.get(hs.output[0], [])
        if (not math.isclose(alpha, 1.0 / 6.0, rel_tol=1e-6) or beta != 0.5
                or len(readers) != 1 or hs.output[0] in g.outputs):
            continue
        mul = readers[0]
        if mul.op_type != "Mul" or sorted(mul.input) != sorted([hs.input[0], hs.output[0]]):
            continue
        hs.op_type = "HardSwish"
        del hs.attribute[:]
        hs.output[0] = mul.output[0]
        g.graph.node.remove(mul)
        fused += 1
    if fused:  # each fusion renames one output and drops one node: one re-index covers all
        g.reindex()
    return fused


def integer_activations(g: Graph, ranges: RangeFn | None = None) -> dict[str, int]:
    """Rewrite HardSigmoid/HardSwish into ORT's integer Add/Mul and quantize LeakyRelu
    inputs (module docstring); ``ranges`` (tensor names -> max |value| on the calibration
    inputs) narrows the added quantizers further. Returns counts per op type (and of those
    left in float for want of a range)."""
    counts: Counter[str] = Counter()
    g.reindex()
    if fused := _fuse_split_hardswish(g):
        counts["hardswish_fused"] = fused
    nodes = [n for n in g.graph.node if (n.op_type in HARD_OPS or n.op_type == "LeakyRelu")
             and not g.is_const(n.input[0])]
    measured = ranges(list(dict.fromkeys(n.input[0] for n in nodes))) if ranges and nodes else {}
    for node in nodes:
        bound = _bound(g, node.input[0], measured)
        if node.op_type in HARD_OPS:
            _rewrite_hard(g, node, bound, counts)
        else:
            _quantize_leaky_input(g, node, bound, counts)
        g.reindex()
    g.finish()
    return dict(counts)


__all__ = ["conv_bound", "integer_activations"]

"""Graph passes that turn a TensorRT-style Q/DQ graph into one ONNX Runtime's CPU provider
fuses into integer kernels (see :func:`trtqat.engines.ort_qdq.reencode_for_cpu`).

TensorRT wants int8 symmetric Q/DQ on layer *inputs* only; ORT on x86 fuses ``DQ -> op -> Q``
groups, and only with uint8 activations. The passes, in order:

1. weights: ``Q(float initializer) -> DQ`` becomes ``DQ(int8 initializer)``;
2. BatchNormalization after a Conv with int8 weights is folded into the per-channel weight
   scale and the bias (exact: the int8 weights do not change);
3. ``ReduceMean`` over H, W becomes ``GlobalAveragePool`` (+ ``Flatten`` without keepdims);
4. a tensor read by several activation Q nodes gets one Q (the largest scale);
5. every op ORT can run on integer kernels gets quantized inputs and outputs, and a
   ``Clip(0, H) -> Q`` (ReLU6) becomes a Q ORT fuses (:mod:`trtqat.engines.ort_qdq_units`);
6. every int8 activation Q/DQ is re-encoded as uint8 with the same scale: zero-point 0 for
   non-negative tensors (ORT then drops the ReLU), 128 otherwise (exact);
7. a Gemm with quantized A and B gets an int32 bias (scale ``s_A * s_B``), which lets ORT
   make it a QGemm with float output.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
from onnx import helper

from trtqat.engines.ort_qdq_graph import KEEPS_SIGN, Graph, attr, set_attr

log = logging.getLogger(__name__)


def _qparams(g: Graph, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """Constant (scale, zero_point) of an 8-bit integer Q or DQ node (zero-point defaults to
    uint8 0); None for anything else, FP8 and INT4 Q/DQ included: these rewrites are for
    INT8 only, and leave other formats as ONNX Runtime runs them."""
    scale = g.const(node.input[1])
    if scale is None:
        return None
    if len(node.input) > 2 and node.input[2]:
        zp = g.const(node.input[2])
        if zp is None:
            return None
    elif attr(node, "output_dtype", 0) not in (0, onnx.TensorProto.UINT8, onnx.TensorProto.INT8):
        return None  # a Q to FP8 or INT4 without zero point
    else:
        zp = np.array(0, np.uint8)
        if node.op_type == "DequantizeLinear":
            w = g.const(node.input[0])
            if w is not None and w.dtype not in (np.int8, np.uint8):
                return None  # DQ of an INT4 or FP8 constant without zero point
    if zp.dtype not in (np.int8, np.uint8):
        return None
    return scale, zp


def _activation_qs(g: Graph) -> list[onnx.NodeProto]:
    return [n for n in g.graph.node if n.op_type == "QuantizeLinear" and not g.is_const(n.input[0])]


def _per_tensor_scale(g: Graph, node: onnx.NodeProto) -> float | None:
    p = _qparams(g, node)
    if p is None or p[0].size != 1 or p[1].size != 1:
        return None
    return float(p[0].reshape(()))


def prequantize_weights(g: Graph) -> int:
    """``Q(float constant) -> DQ``: store the quantized constant, drop the Q."""
    count = 0
    for q in [n for n in g.graph.node if n.op_type == "QuantizeLinear"]:
        w = g.const(q.input[0])
        p = _qparams(g, q)
        if w is None or p is None or attr(q, "block_size", 0):
            continue
        scale, zp = p
        axis = attr(q, "axis", 1)
        if scale.size > 1:
            shape = [1] * w.ndim
            shape[axis % w.ndim] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        info = np.iinfo(zp.dtype)
        value = np.rint(w.astype(np.float32) / scale.astype(np.float32)) + zp.astype(np.float32)
        name = g.add_init(f"{q.input[0]}_quantized", np.clip(value, info.min, info.max).astype(zp.dtype))
        g.replace_uses(q.output[0], name)
        count += 1
    g.finish()
    return count


def fold_batchnorm_nodes(g: Graph) -> int:
    """Fold ``Conv(DQ(int8 W)) -> BatchNormalization`` nodes of an ONNX graph into the weight
    scale and the bias (the graph-level twin of ``trtqat.export.fold_batchnorm``, which folds
    BatchNorm modules of a torch model before export)."""
    count = 0
    for conv in [n for n in g.graph.node if n.op_type == "Conv"]:
        bn = g.only_consumer(conv.output[0])
        wdq = g.producer.get(conv.input[1])
        if bn is None or bn.op_type != "BatchNormalization" or wdq is None:
            continue
        if wdq.op_type != "DequantizeLinear" or len(g.consumers[wdq.output[0]]) != 1:
            continue
        stats = [g.const(i) for i in bn.input[1:5]]
        wq, p = g.const(wdq.input[0]), _qparams(g, wdq)
        if any(s is None for s in stats) or wq is None or p is None or len(bn.output) != 1:
            continue
        if np.any(p[1] != 0) or (p[0].size > 1 and attr(wdq, "axis", 1) % wq.ndim != 0):
            continue
        gamma, beta, mean, var = (s.astype(np.float64) for s in stats)
        factor = gamma / np.sqrt(var + attr(bn, "epsilon", 1e-5))
        bias = g.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else 0.0
        new_bias = (np.asarray(bias, np.float64) - mean) * factor + beta
        sign = np.where(factor < 0, -1, 1).reshape((-1,) + (1,) * (wq.ndim - 1))
        wq_new = np.clip(wq.astype(np.int32) * sign, -127, 127).astype(wq.dtype)
        scale = np.broadcast_to(p[0].astype(np.float64).reshape(-1), factor.shape) * np.abs(factor)
        w_name = g.add_init(f"{conv.input[1]}_bnfolded", wq_new)
        s_name = g.add_init(f"{conv.input[1]}_scale", scale.astype(np.float32))
        z_name = g.add_init(f"{conv.input[1]}_zp", np.zeros(scale.shape, wq.dtype))
        wdq.input[:] = [w_name, s_name, z_name]
        set_attr(wdq, "axis", 0)
        b_name = g.add_init(f"{conv.output[0]}_bias", new_bias.astype(np.float32))
        del conv.input[2:]
        conv.input.append(b_name)
        conv.output[0] = bn.output[0]
        g.graph.node.remove(bn)
        count += 1
    g.finish()
    return count


def reducemean_to_gap(g: Graph, ranks: dict[str, int]) -> int:
    """``ReduceMean`` over every spatial axis -> ``GlobalAveragePool`` (followed by a
    ``Flatten`` when keepdims=0 on a 4-D tensor)."""
    count = 0
    for node in [n for n in g.graph.node if n.op_type == "ReduceMean"]:
        rank = ranks.get(node.input[0])
        keep = attr(node, "keepdims", 1)
        if rank is None or rank < 3 or (keep != 1 and rank != 4):
            continue
        axes = attr(node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = g.const(node.input[1])
        if axes is None:
            continue
        if sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)) != list(range(2, rank)):
            continue
        pooled = node.output[0] if keep == 1 else g.fresh(f"{node.output[0]}_pooled")
        new = [helper.make_node("GlobalAveragePool", [node.input[0]], [pooled],
                                name=node.name or g.fresh("GlobalAveragePool"))]
        if keep != 1:
            new.append(helper.make_node("Flatten", [pooled], list(node.output), axis=1,
                                        name=g.fresh("Flatten")))
        idx = list(g.graph.node).index(node)
        g.graph.node.remove(node)
        for k, n in enumerate(new):
            g.graph.node.insert(idx + k, n)
        count += 1
    g.finish()
    return count


def unify_quantizers(g: Graph) -> dict[str, float]:
    """One Q per tensor: several per-tensor activation Q nodes on one tensor become one with
    the largest scale (no clipping for any reader); identical DQ nodes are merged too.
    Returns counts: tensors whose scales differed, Q and DQ nodes merged, largest ratio of
    the scales unified."""
    groups: dict[str, list[onnx.NodeProto]] = {}
    for q in _activation_qs(g):
        groups.setdefault(q.input[0], []).append(q)
    unified = merged_q = merged_dq = 0
    worst = 1.0
    for qs in groups.values():
        scales = [_per_tensor_scale(g, q) for q in qs]
        zps = {repr(_qparams(g, q)[1]) if _qparams(g, q) else None for q in qs}
        exposed = any(q.output[0] in g.outputs for q in qs)
        if len(qs) > 1 and None not in scales and len(zps) == 1 and None not in zps \
                and not exposed:
            smax = max(scales)
            keep = qs[0]
            new_scale = g.scalar(float(np.float32(smax)), np.float32)
            keep.input[1] = new_scale
            for q in qs[1:]:
                g.replace_uses(q.output[0], keep.output[0])
            g.reindex()
            for dq in g.consumers[keep.output[0]]:
                if dq.op_type == "DequantizeLinear":
                    dq.input[1] = new_scale
                    if len(keep.input) > 2:
                        dq.input[2:] = [keep.input[2]]
            if max(scales) > min(scales):
                unified += 1
                worst = max(worst, max(scales) / min(scales))
            else:
                merged_q += len(qs) - 1
        merged_dq += _merge_dqs(g, qs[0])
    g.finish()
    return {"unified_scales": unified, "merged_q": merged_q, "merged_dq": merged_dq,
            "max_scale_ratio": worst}


def _merge_dqs(g: Graph, q: onnx.NodeProto) -> int:
    g.reindex()
    dqs = [n for n in g.consumers[q.output[0]] if n.op_type == "DequantizeLinear"]
    count = 0
    for dq in dqs[1:]:
        if list(dq.input) == list(dqs[0].input) and attr(dq, "axis", 1) == attr(dqs[0], "axis", 1) \
                and dq.output[0] not in g.outputs:
            g.replace_uses(dq.output[0], dqs[0].output[0])
            count += 1
    return count


def _is_dq_output(g: Graph, name: str) -> bool:
    node = g.producer.get(name)
    return node is not None and node.op_type == "DequantizeLinear" and not g.is_const(node.input[0])


def _nonneg(g: Graph, name: str, memo: dict[str, bool]) -> bool:
    if name in memo:
        return memo[name]
    memo[name] = False  # guards against cycles
    node = g.producer.get(name)
    result = False
    if node is not None:
        op = node.op_type
        if op in ("Relu", "Softmax", "Sigmoid", "HardSigmoid"):
            result = True
        elif op in ("Mul", "Add", "Concat", "Max"):  # non-negative when every input is
            result = all(_nonneg(g, i, memo) or _nonneg_const(g, i) for i in node.input if i)
        elif op == "Clip":
            low = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
            low = attr(node, "min") if low is None else low
            result = low is not None and float(np.asarray(low)) >= 0
        elif op == "DequantizeLinear":
            q = g.producer.get(node.input[0])
            p = _qparams(g, q) if q is not None and q.op_type == "QuantizeLinear" else None
            result = p is not None and ((p[1].dtype == np.uint8 and not np.any(p[1]))
                                        or _nonneg(g, q.input[0], memo))
        elif op == "Resize" and attr(node, "mode", b"nearest") in (b"cubic", "cubic"):
            result = False  # cubic interpolation overshoots
        elif op in KEEPS_SIGN:
            result = _nonneg(g, node.input[0], memo)
    memo[name] = result
    return result


def _nonneg_const(g: Graph, name: str) -> bool:
    value = g.const(name)
    return value is not None and bool(np.all(value >= 0))


def reencode_uint8(g: Graph) -> dict[str, int]:
    """int8 activation Q/DQ -> uint8, same scale: zero-point 0 on non-negative tensors
    (exact up to 127 x scale, ORT drops the ReLU), zero-point + 128 elsewhere (exact)."""
    memo: dict[str, bool] = {}
    counts: Counter[str] = Counter()
    for q in _activation_qs(g):
        p = _qparams(g, q)
        if p is None or p[1].dtype != np.int8 or p[1].size != 1:
            continue
        g.reindex()
        readers = g.consumers[q.output[0]]
        if q.output[0] in g.outputs or any(r.op_type != "DequantizeLinear" for r in readers):
            continue
        zp = int(p[1].reshape(()))
        if zp == 0 and _nonneg(g, q.input[0], memo):
            new_zp, key = 0, "uint8_zero_point_0"
        else:
            new_zp, key = zp + 128, "uint8_zero_point_128"
        z = g.scalar(new_zp, np.uint8)
        for dq in readers:
            dq.input[2:] = [z]
        q.input[2:] = [z]
        counts[key] += 1
    g.finish()
    return dict(counts)


def quantize_gemm_bias(g: Graph) -> int:
    """Float bias of a ``Gemm(DQ(A), DQ(int8 B))`` -> ``DQ(int32 bias)`` with scale s_A * s_B."""
    count = 0
    for gemm in [n for n in g.graph.node if n.op_type == "Gemm"]:
        if len(gemm.input) < 3 or not gemm.input[2] or attr(gemm, "transA", 0):
            continue
        if attr(gemm, "alpha", 1.0) != 1.0 or attr(gemm, "beta", 1.0) != 1.0:
            continue
        a_dq, b_dq = g.producer.get(gemm.input[0]), g.producer.get(gemm.input[1])
        bias = g.const(gemm.input[2])
        if bias is None or not _is_dq_output(g, gemm.input[0]) or b_dq is None \
                or b_dq.op_type != "DequantizeLinear" or not g.is_const(b_dq.input[0]):
            continue
        pa, pb = _qparams(g, a_dq), _qparams(g, b_dq)
        n_out = g.const(b_dq.input[0]).shape[0 if attr(gemm, "transB", 0) else 1]
        if pa is None or pb is None or pa[0].size != 1 or bias.size != n_out:
            continue
        if pb[0].size > 1 and attr(b_dq, "axis", 1) % 2 != (0 if attr(gemm, "transB", 0) else 1):
            continue
        scale = (pa[0].astype(np.float64).reshape(()) * pb[0].astype(np.float64).reshape(-1))
        scale = np.broadcast_to(scale, (n_out,)).astype(np.float32)
        q = np.rint(bias.reshape(-1).astype(np.float64) / scale)
        if np.abs(q).max(initial=0) >= 2**31 - 1:
            continue
        names = [g.add_init(f"{gemm.input[2]}_int32", q.astype(np.int32)),
                 g.add_init(f"{gemm.input[2]}_scale", scale),
                 g.add_init(f"{gemm.input[2]}_zp", np.zeros(n_out, np.int32))]
        out = g.fresh(f"{gemm.input[2]}_dq")
        g.graph.node.append(helper.make_node("DequantizeLinear", names, [out], axis=0,
                                             name=g.fresh("DequantizeLinear")))
        gemm.input[2] = out
        count += 1
    g.finish()
    return count

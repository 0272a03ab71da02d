"""CPU re-encoding passes for MatMul-heavy (transformer) Q/DQ graphs, used by
:func:`trtqat.engines.ort_qdq.reencode_for_cpu`.

What ONNX Runtime's CPU provider (1.2x, x86) does with a TensorRT-style Q/DQ encoder, found by
experiment on all-MiniLM-L6-v2 (``count_compute_nodes(optimized_model(...))``):

* ``DQ(a) -> MatMul <- DQ(int8 W)`` becomes ``MatMulIntegerToFloat`` (int8 or uint8 A,
  per-column B scales), ``DQ -> MatMul -> Q`` becomes ``QLinearMatMul``; a Transpose between
  a weight DQ and the MatMul is folded into the int8 initializer by ORT's transpose
  optimizer, and Q/DQ pairs are moved across Reshape/Transpose (Q·Kᵀ, P·V, 4-D batched);
* but the Linear bias ``Add`` and the attention scale ``Mul`` after a MatMul stay separate
  float kernels (about 15% of the INT8 run time at batch 32, sequence 128).

The passes here:

1. :func:`fold_constants`: exporters compute Q/DQ scales with Reshape/Clip/... subgraphs;
   ORT's basic level (constant folding, Q/DQ propagation, weight transposes folded into
   the int8 initializers) turns them into constants so the other passes can read them;
2. :func:`fuse_matmul_epilogues`: ``DQ(q_a) -> MatMul <- DQ(q_b)`` followed by a scalar
   ``Mul`` (folded into A's scale, exact) and/or a constant per-column bias ``Add`` becomes
   one ``com.microsoft.MatMulIntegerToFloat(q_a, q_b, s_a, s_b, zp_a, zp_b, bias)``. Only
   with uint8 A (run after ``reencode_uint8``): ORT's MLAS has fast u8s8 kernels (VNNI),
   an explicit int8 A fell back to a kernel about 15x slower in our measurement.

Measured on MiniLM (1 thread, batch 32, sequence 128, a shared 2-core AVX-512 VNNI VM):
the unmodified Q/DQ graph already runs ~2x faster than FP32 in ORT; uint8 + fused
epilogues cut the float kernels from 97 to 61 and were the fastest variant at batch 32
(within the noise of the shared machine at batch 1).
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
import onnx
from onnx import helper

from trtqat.engines.ort_qdq_graph import Graph, attr

log = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"


def has_quantized_matmul(model: onnx.ModelProto) -> bool:
    """True when some MatMul reads a DequantizeLinear output (directly or via a Transpose)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.op_type != "MatMul":
            continue
        for name in n.input:
            p = producer.get(name)
            if p is not None and p.op_type == "Transpose":
                p = producer.get(p.input[0])
            if p is not None and p.op_type == "DequantizeLinear":
                return True
    return False


def fold_constants(model: onnx.ModelProto, threads: int = 1) -> onnx.ModelProto:
    """``model`` after ORT's basic (provider-independent) graph optimisations: constant
    subgraphs folded, Q/DQ propagated across data-movement ops, weight Transposes folded."""
    from trtqat.engines.ort_inspect import cpu_session

    with tempfile.TemporaryDirectory(prefix="trtqat-fold-") as tmp:
        path = os.path.join(tmp, "basic.onnx")
        cpu_session(model, threads, "basic", path)
        folded = onnx.load(path)
    used = {n.domain or "" for n in folded.graph.node}
    keep = [o for o in folded.opset_import if (o.domain or "") in used or o.domain in ("", "ai.onnx")]
    del folded.opset_import[:]
    folded.opset_import.extend(keep)
    del folded.metadata_props[:]
    folded.metadata_props.extend(model.metadata_props)
    return folded


def _dq_parts(g: Graph, name: str) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray] | None:
    """``(DQ node, scale, zero_point)`` when ``name`` is a DQ output with constant params."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or attr(dq, "block_size", 0):
        return None
    scale = g.const(dq.input[1])
    zp = g.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if scale is None or (len(dq.input) > 2 and dq.input[2] and zp is None):
        return None
    if zp is None:
        zp = np.zeros(scale.shape, np.uint8)
    return dq, scale, zp


def _quantized_b(g: Graph, name: str) -> tuple[str, np.ndarray, np.ndarray] | None:
    """B of a MatMul as (integer tensor, scale, zp): per-tensor, or per-column for a 2-D
    constant (DQ axis 1)."""
    parts = _dq_parts(g, name)
    if parts is None:
        return None
    dq, scale, zp = parts
    if scale.size > 1:
        w = g.const(dq.input[0])
        if w is None or w.ndim != 2 or attr(dq, "axis", 1) % 2 != 1:
            return None
    return dq.input[0], scale, zp


def _other_const(g: Graph, node: onnx.NodeProto, op_type: str, x: str) -> np.ndarray | None:
    """The constant operand of a binary ``op_type`` node whose other operand is ``x``."""
    other = [i for i in node.input if i != x]
    return g.const(other[0]) if node.op_type == op_type and len(other) == 1 else None


def _scalar_mul(g: Graph, node: onnx.NodeProto, x: str) -> float | None:
    """The constant scalar factor of ``Mul(x, c)`` / ``Mul(c, x)``, else None."""
    c = _other_const(g, node, "Mul", x)
    return float(c.reshape(())) if c is not None and c.size == 1 else None


def _column_bias(g: Graph, node: onnx.NodeProto, x: str, n_cols: int | None) -> np.ndarray | None:
    """The constant per-column bias of ``Add(x, b)`` / ``Add(b, x)`` (shape [N])."""
    b = _other_const(g, node, "Add", x)
    if b is None or b.ndim != 1 or b.dtype != np.float32 or (n_cols is not None and b.size != n_cols):
        return None
    return b


def fuse_matmul_epilogues(g: Graph) -> dict[str, int]:
    """Quantized MatMuls followed by a scalar Mul and/or a bias Add -> one
    ``MatMulIntegerToFloat`` (see the module docstring). Returns counts."""
    counts = {"matmul_integer_to_float": 0, "bias_fused": 0, "scale_folded": 0}
    g.reindex()
    for mm in [n for n in g.graph.node if n.op_type == "MatMul"]:
        a, b = _dq_parts(g, mm.input[0]), _quantized_b(g, mm.input[1])
        if a is None or b is None or a[1].size != 1 or a[2].size != 1:
            continue
        a_dq, a_scale, a_zp = a
        b_int, b_scale, b_zp = b
        if g.is_const(a_dq.input[0]) or (b_zp.size > 1 and np.any(b_zp != 0)):
            continue
        if a_zp.dtype != np.uint8:
            continue  # measured: an explicit int8-A MatMulIntegerToFloat runs ~15x slower
        w = g.const(b_int)
        n_cols = w.shape[-1] if w is not None else None
        out, factor, bias, absorbed = mm.output[0], 1.0, None, []
        user = g.only_consumer(out)
        if user is not None and (f := _scalar_mul(g, user, out)) is not None:
            factor, out = f, user.output[0]
            absorbed.append(user)
            user = g.only_consumer(out)
        if user is not None and (bias := _column_bias(g, user, out, n_cols)) is not None:
            out = user.output[0]
            absorbed.append(user)
        if not absorbed:
            continue  # nothing to gain over ORT's own DQ -> MatMul fusion
        if w is None:
            # activation B (Q·Kᵀ): an explicit u8u8 MatMulIntegerToFloat moved MiniLM's
            # embeddings (cosine 0.9995 vs ORT's own fusion); fold only a scalar Mul into
            # A's DQ scale (exact) and let ORT fuse DQ -> MatMul itself.
            if bias is not None or len(g.consumers[mm.input[0]]) != 1:
                continue
            a_dq.input[1] = g.add_init(f"{mm.name or 'matmul'}_a_scale", np.array(
                float(a_scale.reshape(())) * factor, np.float32))
            mm.output[0] = out
            g.graph.node.remove(absorbed[0])
            g.reindex()
            counts["scale_folded"] += 1
            continue
        scale_a = g.add_init(f"{mm.name or 'matmul'}_a_scale",
                             np.array(float(a_scale.reshape(())) * factor, np.float32))
        zp_a = g.add_init(f"{mm.name or 'matmul'}_a_zp", a_zp.reshape(()).astype(a_zp.dtype))
        scale_b = g.add_init(f"{mm.name or 'matmul'}_b_scale", b_scale.astype(np.float32))
        zp_b = g.add_init(f"{mm.name or 'matmul'}_b_zp", b_zp.astype(b_zp.dtype))
        inputs = [a_dq.input[0], b_int, scale_a, scale_b, zp_a, zp_b]
        if bias is not None:
            inputs.append(g.add_init(f"{mm.name or 'matmul'}_bias", bias))
            counts["bias_fused"] += 1
        counts["scale_folded"] += int(factor != 1.0)
        node = helper.make_node("MatMulIntegerToFloat", inputs, [out], domain=MS_DOMAIN,
                                name=g.fresh(mm.name or "MatMulIntegerToFloat"))
        for dead in [mm, *absorbed]:
            g.graph.node.remove(dead)
        g.graph.node.append(node)
        g.reindex()
        counts["matmul_integer_to_float"] += 1
    if counts["matmul_integer_to_float"] and not any(
            o.domain == MS_DOMAIN for o in g.model.opset_import):
        g.model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    g.finish()
    return counts

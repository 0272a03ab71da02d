"""ONNX Runtime's u8s8 integer GEMM saturates on x86 CPUs without VNNI; keep it exact.

On AVX2 (and AVX-512 without VNNI) MLAS multiplies uint8 activations by int8 weights with
``vpmaddubsw``, which adds two u8·s8 products into a *saturating* int16: ``a0*w0 + a1*w1``
is clipped at 32767 whenever it exceeds it (255·127·2 = 64770 is possible). CPUs with VNNI
(``vpdpbusd``) accumulate in int32 and are exact. ORT uses this kernel for QLinearConv,
QLinearMatMul, QGemm, MatMulInteger and MatMulIntegerToFloat, and its Q/DQ fusion turns
int8 activations into uint8 first (QDQS8ToU8Transformer), so a Q/DQ graph with int8 weights
silently loses accuracy on such machines (measured on an AMD EPYC with AVX2 only: a QLinearConv
of random uint8 x int8 data off by 30+ output steps; uint8 x uint8 exact).

The way around it, exact on every CPU: store such weights as uint8 with zero-point + 128
(``w_u8 - zp_u8 == w_s8 - zp_s8``), which runs MLAS's u8u8 kernel (int16 x int16 -> int32,
no saturation; 1.2-1.5x slower than u8s8 on dense convs here). It is needed only where
the uint8 activation can exceed 127: an activation re-encoded from int8 with zero-point 0
(non-negative, at most 127 steps within its calibrated range) keeps int8 weights, since
127·127·2 < 32767; depthwise convs use a direct kernel that does not saturate.

:func:`u8s8_saturates` finds out by running ORT once on values that saturate;
:func:`exact_weights` applies the rewrite to a :class:`~trtqat.engines.ort_qdq_graph.Graph`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtqat.engines.ort_qdq_graph import Graph, attr

log = logging.getLogger(__name__)

# TRTQAT_ORT_U8S8=exact|saturates overrides the probe (tests, or a machine known to differ)
ENV_OVERRIDE = "TRTQAT_ORT_U8S8"
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "avx512vnni", "avxvnni")
# ops whose input 1 is a weight multiplied on MLAS's u8s8 GEMM
_GEMM_OPS = frozenset({"Conv", "MatMul", "Gemm"})
_SKIP_TO_WEIGHT = frozenset({"Transpose", "Reshape", "Identity"})


def cpu_has_vnni() -> bool | None:
    """True/False from the flags in /proc/cpuinfo (x86 Linux); None where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return any(flag in flags for flag in _VNNI_FLAGS)
    except OSError:
        return None
    return None


def _probe_model() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    k, n = 64, 16
    b = np.full((k, n), 127, np.int8)
    b[:, ::2] = -127
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "u8s8_probe",
        [helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, [4, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, [4, n])],
        [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    a = np.full((4, k), 255, np.uint8)
    return model, a, a.astype(np.int64) @ b.astype(np.int64)


@functools.lru_cache(maxsize=1)
def _probe() -> bool:
    import onnxruntime as ort

    model, a, want = _probe_model()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"a": a})[0]
    return not np.array_equal(got.astype(np.int64), want)


def u8s8_saturates() -> bool:
    """True when ORT's CPU u8 x s8 integer GEMM saturates on this machine (measured once per
    process on a 4x64 MatMulInteger of 255 x ±127; ``TRTQAT_ORT_U8S8=exact|saturates``
    overrides the measurement)."""
    override = os.environ.get(ENV_OVERRIDE, "").strip().lower()
    if override in ("exact", "saturates"):
        return override == "saturates"
    try:
        return _probe()
    except Exception as exc:  # no onnxruntime, or a build without MatMulInteger
        log.info("u8s8 probe did not run (%s): assuming exact kernels", exc)
        return False


def cpu_int8_info() -> dict[str, object]:
    """What the ORT CPU integer kernels do here: ``{"u8s8_saturates", "vnni_flag"}``."""
    return {"u8s8_saturates": u8s8_saturates(), "vnni_flag": cpu_has_vnni()}


def _weight_dq(g: Graph, name: str) -> onnx.NodeProto | None:
    """The DequantizeLinear of a constant int8 weight behind ``name`` (through Transpose,
    Reshape or Identity), else None."""
    node = g.producer.get(name)
    for _ in range(4):
        if node is None or node.op_type not in _SKIP_TO_WEIGHT:
            break
        node = g.producer.get(node.input[0])
    if node is None or node.op_type != "DequantizeLinear" or attr(node, "block_size", 0):
        return None
    w = g.const(node.input[0])
    return node if w is not None and w.dtype == np.int8 else None


def _is_depthwise(conv: onnx.NodeProto, w: np.ndarray) -> bool:
    group = attr(conv, "group", 1)
    return group > 1 and w.ndim >= 3 and w.shape[1] == 1 and w.shape[0] % group == 0


def _activation_q(g: Graph, name: str) -> str | None:
    """The QuantizeLinear output behind an activation DQ ``name`` (its 7-bit clip marked)."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or g.is_const(dq.input[0]):
        return None
    clip = g.producer.get(dq.input[0])
    if clip is not None and clip.op_type == "Clip" and len(clip.input) > 2:
        low, high = g.const(clip.input[1]), g.const(clip.input[2])
        if low is not None and high is not None and high.dtype == np.uint8 and int(high) <= 127:
            return SEVEN_BIT_CLIP  # a uint8 Clip at 127 steps at most
    return dq.input[0]


def _to_uint8(g: Graph, int_name: str, zp_name: str | None, zp_shape: tuple[int, ...]
              ) -> tuple[str, str]:
    w = g.const(int_name)
    zp = g.const(zp_name) if zp_name else np.zeros(zp_shape, np.int8)
    w_u8 = (w.astype(np.int16) + 128).astype(np.uint8)
    zp_u8 = (np.asarray(zp).astype(np.int16) + 128).astype(np.uint8)
    return g.add_init(f"{int_name}_u8", w_u8), g.add_init(f"{int_name}_zp_u8", zp_u8)


# integer ops with explicit weight inputs: op -> (activation, weight, weight zero-point)
_INTEGER_OPS = {"MatMulIntegerToFloat": (0, 1, 5), "MatMulInteger": (0, 1, 3),
                "QLinearConv": (0, 3, 5), "QLinearMatMul": (0, 3, 5)}


def _explicit(g: Graph, node: onnx.NodeProto, seven_bit: set[str], counts: Counter) -> None:
    a, w_idx, zp_idx = _INTEGER_OPS[node.op_type]
    w = g.const(node.input[w_idx]) if len(node.input) > w_idx else None
    if w is None or w.dtype != np.int8:
        return
    if node.op_type == "QLinearConv" and _is_depthwise(node, w):
        counts["kept_int8_depthwise"] += 1
        return
    if node.input[a] in seven_bit:
        counts["kept_int8_7bit_input"] += 1
        return
    zp = node.input[zp_idx] if len(node.input) > zp_idx and node.input[zp_idx] else None
    new_w, new_zp = _to_uint8(g, node.input[w_idx], zp, ())
    while len(node.input) <= zp_idx:
        node.input.append("")
    node.input[w_idx], node.input[zp_idx] = new_w, new_zp
    counts[node.op_type] += 1


SEVEN_BIT_CLIP = "<uint8 Clip at most 127>"


def exact_weights(g: Graph, seven_bit: set[str] = frozenset()) -> dict[str, int]:
    """Re-store int8 weights as uint8 (zero-point + 128, exact) where ORT's u8s8 kernel could
    saturate: ``DQ(weight) -> Conv`` (not depthwise), MatMul and Gemm, and the integer ops
    that take weights directly (MatMulIntegerToFloat, MatMulInteger, QLinearConv,
    QLinearMatMul), unless their activation is one of the ``seven_bit`` Q outputs (uint8,
    zero-point 0, at most 127 steps). Returns counts per op type and of weights kept int8."""
    counts: Counter[str] = Counter()
    for node in list(g.graph.node):
        if node.op_type in _INTEGER_OPS:
            _explicit(g, node, seven_bit, counts)
            continue
        if node.op_type not in _GEMM_OPS or len(node.input) < 2:
            continue
        dq = _weight_dq(g, node.input[1])
        if dq is None:
            continue
        if node.op_type == "Conv" and _is_depthwise(node, g.const(dq.input[0])):
            counts["kept_int8_depthwise"] += 1
            continue
        source = _activation_q(g, node.input[0])
        if source in seven_bit or source == SEVEN_BIT_CLIP:
            counts["kept_int8_7bit_input"] += 1
            continue
        zp = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
        w_name, zp_name = _to_uint8(g, dq.input[0], zp, tuple(np.shape(g.const(dq.input[1]))))
        dq.input[:] = [w_name, dq.input[1], zp_name]
        counts[node.op_type] += 1
    g.finish()
    return dict(counts)


REENCODED_KEY = "trtqat.cpu_reencode"  # set by trtqat.engines.ort_qdq.prepare_model


def reencode_report(model: onnx.ModelProto) -> dict[str, Any]:
    """The CPU re-encoding's report stored in ``model``'s metadata ({} when none)."""
    import json

    text = next((p.value for p in model.metadata_props if p.key == REENCODED_KEY), None)
    return json.loads(text) if text else {}


def guard_model(model: onnx.ModelProto, saturates: bool | None = None
                ) -> tuple[onnx.ModelProto, dict[str, object]]:
    """``model`` with :func:`exact_weights` applied (constant subgraphs folded by ORT's basic
    level and weight Q of constants folded first) when ORT's u8s8 kernels saturate here,
    else ``model`` itself. Models the CPU re-encoding
    already handled (metadata ``trtqat.cpu_reencode``) are left alone. Returns the model and
    ``{"u8s8_saturates", "uint8_weights"}``."""
    from trtqat.engines.ort_qdq_matmul import fold_constants, has_quantized_matmul
    from trtqat.engines.ort_qdq_rewrite import prequantize_weights

    saturates = u8s8_saturates() if saturates is None else saturates
    info: dict[str, object] = {"u8s8_saturates": saturates}
    if not saturates or any(p.key == REENCODED_KEY for p in model.metadata_props):
        return model, info
    if not any(n.op_type == "DequantizeLinear" or n.op_type in _INTEGER_OPS
               for n in model.graph.node):
        return model, info
    import copy

    g = Graph(fold_constants(model) if has_quantized_matmul(model) else copy.deepcopy(model))
    prequantize_weights(g)
    counts = exact_weights(g)
    info["uint8_weights"] = counts
    if not any(k for k in counts if not k.startswith("kept")):
        return model, info
    return g.model, info


__all__ = ["REENCODED_KEY", "guard_model", "reencode_report", "ENV_OVERRIDE", "cpu_has_vnni", "cpu_int8_info", "exact_weights", "u8s8_saturates"]

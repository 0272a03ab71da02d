"""Re-encode a TensorRT-style Q/DQ ONNX graph so ONNX Runtime's CPU provider runs it on
integer kernels (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm), count what ORT
made of it, and check how far the outputs moved.

As exported for TensorRT (int8 symmetric Q/DQ on layer inputs only) the graph runs on float
kernels in ORT plus Q/DQ overhead, slower than FP32. :func:`reencode_for_cpu` applies the
passes of :mod:`trtqat.engines.ort_qdq_rewrite`, then compares the result with the
unmodified model on the calibration inputs and fails below 99% top-1 agreement (classifiers)
or below 0.99 mean cosine similarity (embedding models, see :func:`is_embedding_output`).
MatMul graphs (transformer encoders) first get ORT's constant folding and afterwards the
epilogue fusion of :mod:`trtqat.engines.ort_qdq_matmul`.

Typical use::

    cpu_model, report = reencode_for_cpu(onnx.load("model_int8.onnx"), feeds)
    print(report["compute_nodes"]["after"])   # {'integer': {...}, 'float': {...}, ...}
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from trtqat.arrays import row_cosines
from trtqat.engines.detect_agreement import agreement as detection_agreement
from trtqat.engines.detect_agreement import is_detection
from trtqat.engines.errors import EngineBuildError
from trtqat.engines.hints import ORT_PASSES, read_hints
from trtqat.engines.onnx_io import has_float16, ort_disabled_optimizers
from trtqat.engines.ort_qdq_graph import Graph
from trtqat.engines.ort_qdq_matmul import (
    fold_constants,
    fuse_matmul_epilogues,
    has_quantized_matmul,
)
from trtqat.engines.ort_qdq_rewrite import (
    fold_batchnorm_nodes,
    insert_output_quantizers,
    prequantize_weights,
    quantize_gemm_bias,
    reducemean_to_gap,
    reencode_uint8,
    unify_quantizers,
)

log = logging.getLogger(__name__)

Feeds = Sequence[dict[str, np.ndarray]]

INTEGER_OPS = frozenset({
    "QLinearConv", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearAveragePool",
    "QGemm", "QLinearMatMul", "MatMulInteger", "ConvInteger", "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu",
    "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere", "QAttention", "NhwcQLinearConv",
})
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Ops that only move, reshape or convert data: neither integer nor float compute.
DATA_OPS = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Shape", "Gather", "Concat",
    "Slice", "Identity", "Constant", "ReorderInput", "ReorderOutput", "Cast", "Expand", "Split",
    "Tile", "Pad", "ConstantOfShape", "Range",
})
# Ops whose kernel follows its input type (integer on uint8/int8 tensors).
TYPED_OPS = frozenset({"MaxPool", "NhwcMaxPool", "GlobalMaxPool", "Relu", "Resize"})
_INT_TYPES = {onnx.TensorProto.UINT8, onnx.TensorProto.INT8}


# The re-encoding adds output quantizers of its own; on MiniLM they move the embeddings by a
# mean cosine of about 0.99 against the unrewritten Q/DQ graph (and by less than 0.003 against
# FP32), so 0.98 passes that and still stops a broken rewrite.
DEFAULT_MIN_COSINE = 0.98


class AgreementError(EngineBuildError):
    """A rewritten model's outputs moved too far from the model it was made from."""


def cpu_session(model: onnx.ModelProto, threads: int = 2, level: str = "all",
                optimized_path: str | None = None):
    """An ONNX Runtime CPU session for ``model`` (``level`` 'all' or 'basic' graph
    optimisation, warnings silenced, ``threads`` intra-op threads)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    }[level]
    if optimized_path is not None:
        so.optimized_model_filepath = optimized_path
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=ort_disabled_optimizers(model))


def optimized_model(model: onnx.ModelProto, threads: int = 2) -> onnx.ModelProto:
    """The graph ORT's CPU provider runs for ``model`` (ORT_ENABLE_ALL, as saved by
    ``SessionOptions.optimized_model_filepath``)."""
    with tempfile.TemporaryDirectory(prefix="trtqat-ort-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        cpu_session(model, threads, "all", path)
        return onnx.load(path)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor, from declarations plus a forward pass over node kinds."""
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    for n in g.node:
        op = n.op_type
        if op in ("MatMulInteger", "ConvInteger"):
            t = onnx.TensorProto.INT32
        elif op == "QuantizeLinear" or op.startswith("QLinear") or (op == "QGemm" and len(n.input) > 8):
            # QLinear* ops keep their input's type; QuantizeLinear takes its zero-point's
            zp = {"QGemm": 8, "QLinearConcat": 1}.get(op, 2)
            t = types.get(n.input[zp], onnx.TensorProto.UINT8) if len(n.input) > zp else onnx.TensorProto.UINT8
        elif n.op_type in TYPED_OPS or n.op_type in DATA_OPS:
            t = types.get(n.input[0], onnx.TensorProto.FLOAT) if n.input else onnx.TensorProto.FLOAT
        else:
            t = onnx.TensorProto.FLOAT
        for o in n.output:
            types.setdefault(o, t)
    return types


def count_compute_nodes(model: onnx.ModelProto) -> dict[str, Any]:
    """Integer vs float compute nodes of ``model`` (pass an ORT-optimised graph, see
    :func:`optimized_model`).

    Returns ``{"integer": {op: n}, "float": {op: n}, "integer_total", "float_total",
    "quantize_dequantize": n, "other": {op: n}}``; pooling on uint8/int8 tensors counts as
    integer, data-movement ops (Reshape, Transpose, ...) as other.
    """
    types = _elem_types(model)
    integer: Counter[str] = Counter()
    floating: Counter[str] = Counter()
    other: Counter[str] = Counter()
    qdq = 0
    for n in model.graph.node:
        op = n.op_type
        if op in QDQ_OPS:
            qdq += 1
        elif op in INTEGER_OPS:
            integer[op] += 1
        elif op in DATA_OPS:
            other[op] += 1
        elif op in TYPED_OPS and n.input and types.get(n.input[0]) in _INT_TYPES:
            integer[op] += 1
        else:
            floating[op] += 1
    return {"integer": dict(integer), "float": dict(floating),
            "integer_total": sum(integer.values()), "float_total": sum(floating.values()),
            "quantize_dequantize": qdq, "other": dict(other)}


def _run(session, feeds: Feeds) -> list[np.ndarray]:
    return [session.run(None, feed)[0] for feed in feeds]


EMBEDDING_TASKS = frozenset({"sentence-embedding", "embedding", "feature-extraction"})


def is_embedding_output(model: onnx.ModelProto, outputs: Sequence[np.ndarray] = ()) -> bool:
    """True when the first output holds embeddings rather than class scores: the model's
    metadata ``trtqat.task`` is an embedding task, the output's name contains "embedding",
    or every row of ``outputs`` (reference values) has unit L2 norm."""
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get("trtqat.task") in EMBEDDING_TASKS:
        return True
    if model.graph.output and "embedding" in model.graph.output[0].name.lower():
        return True
    rows = [o.reshape(-1, o.shape[-1]) for o in outputs if o.ndim >= 2 and o.shape[-1] > 1]
    return bool(rows) and all(
        np.allclose(np.linalg.norm(r.astype(np.float64), axis=-1), 1.0, atol=1e-3) for r in rows)


def check_agreement(reference_model: onnx.ModelProto, candidate_model: onnx.ModelProto,
                    feeds: Feeds, min_top1: float = 0.99, threads: int = 2,
                    min_cosine: float | None = None, metric: str = "auto") -> dict[str, Any]:
    """Compare the first output of two models on ``feeds`` with ORT's CPU provider.

    ``metric`` "top1" (classifiers: argmax over the last axis per sample, at least
    ``min_top1`` must agree), "cosine" (embeddings: mean cosine similarity per row at least
    ``min_cosine``, default :data:`DEFAULT_MIN_COSINE`) or "auto" (cosine when
    :func:`is_embedding_output`). Returns ``{"metric", "top1_agreement", "samples",
    "max_abs_diff", "mean_abs_diff", "max_abs_reference"}`` plus ``mean_cosine`` and
    ``min_cosine`` for the cosine metric; raises :class:`AgreementError` below the threshold.
    """
    if not feeds:
        raise AgreementError("check_agreement got no inputs: pass at least one feed dict")
    if metric not in ("auto", "top1", "cosine"):
        raise ValueError(f"metric must be auto, top1 or cosine, got {metric!r}")
    ref = _run(cpu_session(reference_model, threads), feeds)
    cand = _run(cpu_session(candidate_model, threads), feeds)
    if metric == "auto":
        metric = "cosine" if is_embedding_output(reference_model, ref) else "top1"
    same = total = 0
    max_diff = mean_acc = ref_max = 0.0
    detector = metric == "top1" and is_detection(reference_model)
    for r, c in zip(ref, cand):
        r2, c2 = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
        if detector:  # confident anchors: same class, overlapping box
            agree, confident = detection_agreement(r, c)
            same, total = same + agree, total + confident
        else:
            same += int((r2.argmax(-1) == c2.argmax(-1)).sum())
            total += r2.shape[0]
        diff = np.abs(r2.astype(np.float64) - c2)
        max_diff = max(max_diff, float(diff.max()))
        mean_acc += float(diff.sum())
        ref_max = max(ref_max, float(np.abs(r2).max()))
    result = {"metric": "detection" if detector else metric,
              "top1_agreement": same / total if total else 1.0, "samples": total,
              "max_abs_diff": max_diff,
              "mean_abs_diff": mean_acc / max(1, sum(r.size for r in ref)),
              "max_abs_reference": ref_max}
    if metric == "cosine":
        cos = np.concatenate([row_cosines(r, c) for r, c in zip(ref, cand)])
        threshold = DEFAULT_MIN_COSINE if min_cosine is None else min_cosine
        result.update(mean_cosine=float(cos.mean()), min_cosine=float(cos.min()))
        if result["mean_cosine"] < threshold:
            raise AgreementError(
                f"CPU re-encoding moved the embeddings too far: mean cosine similarity "
                f"{result['mean_cosine']:.4f} < {threshold:.4f} on {total} rows (lowest "
                f"{result['min_cosine']:.4f}); build with --ortPrepare=none or calibrate on "
                "representative inputs")
    elif result["top1_agreement"] < min_top1:
        raise AgreementError(
            f"CPU re-encoding moved the outputs too far: "
            f"{'detection' if detector else 'top-1'} agreement "
            f"{result['top1_agreement']:.2%} < {min_top1:.2%} on {total} inputs (max abs diff "
            f"{max_diff:.3g}); build without CPU re-encoding or calibrate on representative inputs"
        )
    return result


def _ranges_fn(model: onnx.ModelProto, feeds: Feeds, threads: int):
    def ranges(names: list[str]) -> dict[str, float]:
        probe = copy.deepcopy(model)
        known = {o.name for o in probe.graph.output}
        for name in names:
            if name not in known:
                probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        session = cpu_session(probe, threads, "basic")
        amax = dict.fromkeys(names, 0.0)
        for feed in feeds:
            for name, value in zip(names, session.run(names, feed)):
                amax[name] = max(amax[name], float(np.abs(value).max()))
        return amax

    return ranges


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference is best effort: an unknown rank skips that rewrite
        inferred = model
    g = inferred.graph
    return {v.name: len(v.type.tensor_type.shape.dim)
            for v in list(g.input) + list(g.value_info) + list(g.output)
            if v.type.tensor_type.HasField("shape")}


def is_tensorrt_qdq(model: onnx.ModelProto) -> bool:
    """True when ``model`` quantizes some activation to int8 (TensorRT-style Q/DQ)."""
    g = Graph(model)
    for n in g.graph.node:
        if n.op_type == "QuantizeLinear" and not g.is_const(n.input[0]) and len(n.input) > 2:
            zp = g.const(n.input[2])
            if zp is not None and zp.dtype == np.int8:
                return True
    return False


def reencode_for_cpu(model: onnx.ModelProto, calib_feeds: Feeds | None, *,
                     min_top1: float = 0.99, unify: bool = True, threads: int = 2,
                     count_nodes: bool = True, min_cosine: float | None = None
                     ) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Rewrite a TensorRT-style Q/DQ ``model`` for ORT's CPU integer kernels.

    ``calib_feeds`` (input name -> array dicts) calibrate the Q/DQ the rewrite adds and are
    the inputs of the agreement check against ``model`` (:class:`AgreementError` when top-1
    agreement of a classifier is below ``min_top1``, or the mean cosine of embedding outputs
    below ``min_cosine``, default 0.98); without them added ranges come from neighbouring
    quantizers and nothing is checked. ``unify`` gives a tensor read by several Q nodes one
    Q (the largest scale).
    Returns the new model (``model`` is not modified) and a report of what was rewritten,
    the integer/float node counts of ORT's optimised graph before and after, and the
    agreement figures.
    """
    start = time.perf_counter()
    report: dict[str, Any] = {"rewritten": False}
    if not is_tensorrt_qdq(model):
        report["reason"] = "no int8 activation QuantizeLinear: not a TensorRT-style Q/DQ graph"
        return model, report
    if has_float16(model):
        # ORT's CPU integer fusions take float32 Q/DQ only; an INT8+FP16 graph runs as it is.
        report["reason"] = "float16 tensors (INT8+FP16 variant): ORT's CPU integer kernels need float32"
        return model, report
    feeds = list(calib_feeds) if calib_feeds else []
    run = set(read_hints(model).ort_passes())  # the family's engine hints, else every pass
    matmul_graph = has_quantized_matmul(model)
    # MatMul graphs: fold the exporter's scale subgraphs (and weight Transposes) first
    fold = matmul_graph and "fold_constants" in run
    g = Graph(fold_constants(model, threads) if fold else copy.deepcopy(model))
    passes: dict[str, Any] = {}
    if "prequantize_weights" in run:
        passes["weights_prequantized"] = prequantize_weights(g)
    if "fold_batchnorm" in run:
        passes["batchnorm_folded"] = fold_batchnorm_nodes(g)
    if "reducemean_to_gap" in run:
        passes["reducemean_to_globalaveragepool"] = reducemean_to_gap(g, _ranks(g.model))
    if unify and "unify_quantizers" in run:
        passes.update(unify_quantizers(g))
    if "output_quantizers" in run:
        ranges = _ranges_fn(g.model, feeds, threads) if feeds else None
        passes["output_quantizers_added"] = insert_output_quantizers(g, ranges)
    if "reencode_uint8" in run:
        passes["activations_reencoded"] = reencode_uint8(g)
    if "quantize_gemm_bias" in run:
        passes["gemm_bias_quantized"] = quantize_gemm_bias(g)
    if matmul_graph and "fuse_matmul_epilogues" in run:
        passes["matmul_epilogues"] = fuse_matmul_epilogues(g)
    new_model = g.model
    onnx.checker.check_model(new_model)
    report.update(rewritten=True, passes=passes,
                  skipped_passes=[p for p in ORT_PASSES if p not in run])
    if count_nodes:
        report["compute_nodes"] = {
            "before": count_compute_nodes(optimized_model(model, threads)),
            "after": count_compute_nodes(optimized_model(new_model, threads)),
        }
    if feeds:
        report["agreement"] = check_agreement(model, new_model, feeds, min_top1, threads,
                                              min_cosine)
    report["seconds"] = round(time.perf_counter() - start, 3)
    log.info("CPU re-encoding: %s", report)
    return new_model, report


def prepare_model(model: onnx.ModelProto, options: Any = None) -> onnx.ModelProto:
    """The ORT backend's pre-session step: :func:`reencode_for_cpu` for TensorRT-style Q/DQ
    graphs, unchanged otherwise.

    Reads, when present on ``options``: ``calib_feeds``, ``min_top1``, ``min_cosine``,
    ``threads``, ``cpu_reencode`` (False skips the rewrite). The report is logged and stored in the
    model's metadata under ``trtqat.cpu_reencode``.
    """
    if not getattr(options, "cpu_reencode", True):
        return model
    threads = getattr(options, "threads", None) or 2
    new_model, report = reencode_for_cpu(model, getattr(options, "calib_feeds", None),
                                         min_top1=getattr(options, "min_top1", 0.99),
                                         threads=threads,
                                         min_cosine=getattr(options, "min_cosine", None))
    if report.get("rewritten"):
        entry = new_model.metadata_props.add()
        entry.key, entry.value = "trtqat.cpu_reencode", json.dumps(report, default=str)
    return new_model

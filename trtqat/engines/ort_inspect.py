"""ONNX Runtime CPU sessions for the re-encoding, what ORT made of a graph (integer vs float
compute nodes of its optimised model) and how far a rewritten model's outputs moved
(:func:`check_agreement`). Used by :mod:`trtqat.engines.ort_qdq`, which re-exports them.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from trtqat.arrays import row_cosines
from trtqat.engines.detect_agreement import agreement as detection_agreement
from trtqat.engines.detect_agreement import is_detection, layout_of
from trtqat.engines.errors import EngineBuildError
from trtqat.engines.onnx_io import ort_disabled_optimizers
from trtqat.engines.ort_check import check_metric

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
TYPED_OPS = frozenset({"MaxPool", "NhwcMaxPool", "GlobalMaxPool", "Relu", "Resize", "Clip"})
_INT_TYPES = {onnx.TensorProto.UINT8, onnx.TensorProto.INT8}


# The re-encoding adds output quantizers of its own; on MiniLM they move the embeddings by a
# mean cosine of about 0.99 against the unrewritten Q/DQ graph (and by less than 0.003 against
# FP32), so 0.98 passes that and still stops a broken rewrite.
DEFAULT_MIN_COSINE = 0.98


class AgreementError(EngineBuildError):
    """A rewritten model's outputs moved too far from the model it was made from
    (``agreement``: what :func:`check_agreement` measured, when it got that far)."""

    agreement: dict[str, Any] | None = None


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
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")  # as ort.py
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


TIE = 1e-5  # reference scores closer than this fraction of the output scale are a tie


def _top1_agrees(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Per row: the candidate's top-1 is the reference's, or a class the reference scores
    within float32 resolution of its top-1 (a tie, e.g. the near-constant outputs of a
    network whose activations vanish)."""
    rows = np.arange(len(ref))
    pick = cand.argmax(-1)
    tol = TIE * max(float(np.abs(ref).max(initial=0.0)), np.finfo(np.float32).tiny)
    return (pick == ref.argmax(-1)) | (ref.max(-1) - ref[rows, pick] <= tol)


NOISE_Z = 3.0  # a top-1 counts where the reference leads by 3 standard deviations of noise


def decisive_rows(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Per row of ``[rows, classes]`` scores: the reference's top-1 is decisive, its lead over
    the runner-up beyond :data:`NOISE_Z` standard deviations of the noise the candidate
    shows on that row (of the difference of two scores: sqrt(2) x the row's noise, estimated
    robustly as 1.4826 x the median absolute difference, so that a large error on a few
    classes does not raise it) and beyond a float tie (:data:`TIE`). Flips below that are
    what noise of the measured level does to close scores (a random-weight network's); the
    level itself is bounded by the centered cosine."""
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    if r.shape[-1] < 2:
        return np.zeros(len(r), bool)
    top2 = np.sort(r, -1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    noise = 1.4826 * np.median(np.abs(c - r), axis=-1)
    tol = TIE * max(float(np.abs(r).max(initial=0.0)), np.finfo(np.float32).tiny)
    return (margin > NOISE_Z * np.sqrt(2.0) * noise) & (margin > tol)


def _centered(ref: Sequence[np.ndarray], cand: Sequence[np.ndarray]) -> np.ndarray:
    """Cosines of the rows minus their means, over the rows whose reference scores are not
    constant (within float32 resolution)."""
    out = []
    for r, c in zip(ref, cand):
        if not r.ndim or r.shape[-1] < 2:
            continue
        r2 = r.reshape(-1, r.shape[-1]).astype(np.float64)
        c2 = c.reshape(-1, c.shape[-1]).astype(np.float64)
        r2, c2 = r2 - r2.mean(-1, keepdims=True), c2 - c2.mean(-1, keepdims=True)
        scale = TIE * np.sqrt(r2.shape[-1]) * np.abs(r.astype(np.float64)).max(-1).reshape(-1)
        keep = np.linalg.norm(r2, axis=-1) > np.maximum(scale, np.finfo(np.float32).tiny)
        out.append(row_cosines(r2[keep], c2[keep]) if keep.any() else np.zeros(0))
    return np.concatenate(out) if out else np.zeros(0)


def mean_centered_cosine(ref: Sequence[np.ndarray], cand: Sequence[np.ndarray]) -> float:
    """Mean cosine of each output row with the reference's after subtracting each row's
    mean: how well the candidate keeps the shape of the scores, meaningful even where
    near-constant scores (a random-weight network) make top-1 noise. Rows whose reference
    is constant are left out (NaN: none left)."""
    cos = _centered(ref, cand)
    return float(cos.mean()) if cos.size else float("nan")


def _failed(result: dict[str, Any], message: str) -> AgreementError:
    error = AgreementError(message)
    error.agreement = result
    return error


def check_agreement(reference_model: onnx.ModelProto, candidate_model: onnx.ModelProto,
                    feeds: Feeds, min_top1: float = 0.99, threads: int = 2,
                    min_cosine: float | None = None, metric: str = "auto") -> dict[str, Any]:
    """Compare the first output of two models on ``feeds`` with ORT's CPU provider.

    ``metric`` "top1" (classifiers: the mean centered cosine of the scores,
    :func:`mean_centered_cosine`, at least ``min_cosine``, and top-1 agreement at least
    ``min_top1`` over the rows whose reference top-1 is decisive, :func:`decisive_rows`; a
    candidate top-1 the reference scores within 1e-5 of the output scale of its own is a
    tie, not a flip), "cosine" (embeddings: mean cosine similarity per row at least
    ``min_cosine``), "detection" (:mod:`trtqat.engines.detect_agreement`) or "auto"
    (:func:`trtqat.engines.ort_check.check_metric`: the file's family, else its output).
    ``min_cosine`` None: :data:`DEFAULT_MIN_COSINE`. Returns ``{"metric",
    "top1_agreement", "samples", "decisive", "max_abs_diff", "mean_abs_diff",
    "max_abs_reference", "mean_centered_cosine"}`` plus ``mean_cosine`` and ``min_cosine``
    for the cosine metric; raises :class:`AgreementError` below a threshold.
    """
    if not feeds:
        raise AgreementError("check_agreement got no inputs: pass at least one feed dict")
    if metric not in ("auto", "top1", "cosine", "detection"):
        raise ValueError(f"metric must be auto, top1, cosine or detection, got {metric!r}")
    # the reference runs Q/DQ as written (no integer fusion: float maths on dequantized
    # values, the ONNX semantics), whatever this CPU's integer kernels do
    ref = _run(cpu_session(reference_model, threads, "basic"), feeds)
    try:
        cand = _run(cpu_session(candidate_model, threads), feeds)
    except Exception as exc:  # ORT's pybind types: a kernel that refuses its parameters
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EngineBuildError(f"the CPU re-encoded graph fails in ONNX Runtime on the check "
                               f"inputs ({first}); build with --ortPrepare=none") from None
    if metric == "auto":
        metric = check_metric(reference_model, ref, is_embedding_output(reference_model, ref))
    cos_min = DEFAULT_MIN_COSINE if min_cosine is None else min_cosine
    same = total = rows = 0
    max_diff = mean_acc = ref_max = 0.0
    finite = True  # (max() drops a NaN: count them apart)
    if metric == "top1" and is_detection(reference_model):
        metric = "detection"  # a detector's head has no top-1
    detector = metric == "detection"
    layout = layout_of(reference_model) if detector else None  # which channels are scores
    for r, c in zip(ref, cand):
        r2, c2 = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
        rows += r2.shape[0]
        if detector:  # confident anchors: same class, overlapping box
            agree, confident = detection_agreement(r, c, layout)
            same, total = same + agree, total + confident
        else:
            decisive = decisive_rows(r2, c2)
            same += int((_top1_agrees(r2, c2) & decisive).sum())
            total += int(decisive.sum())
        diff = np.abs(r2.astype(np.float64) - c2)
        finite = finite and bool(np.isfinite(diff).all())
        max_diff = max(max_diff, float(diff.max()))
        mean_acc += float(diff.sum())
        ref_max = max(ref_max, float(np.abs(r2).max()))
    result = {"metric": metric, "top1_agreement": same / total if total else 1.0,
              "samples": rows if metric == "top1" else total, "decisive": total,
              "max_abs_diff": max_diff,
              "mean_abs_diff": mean_acc / max(1, sum(r.size for r in ref)),
              "max_abs_reference": ref_max,
              "mean_centered_cosine": mean_centered_cosine(ref, cand)}
    if not finite:
        ref_finite = all(np.isfinite(r).all() for r in ref)
        result["non_finite"] = True
        raise _failed(result, "CPU re-encoding gives non-finite outputs where the Q/DQ model "
                      f"gives {'finite ones' if ref_finite else 'non-finite ones too'} on the "
                      "check inputs; build with --ortPrepare=none")
    fix = "build without CPU re-encoding or calibrate on representative inputs"
    if metric == "cosine":
        cos = np.concatenate([row_cosines(r, c) for r, c in zip(ref, cand)])
        result.update(mean_cosine=float(cos.mean()), min_cosine=float(cos.min()),
                      samples=int(cos.size))
        if result["mean_cosine"] < cos_min:
            raise _failed(result,
                f"CPU re-encoding moved the embeddings too far: mean cosine similarity "
                f"{result['mean_cosine']:.4f} < {cos_min:.4f} on {cos.size} rows (lowest "
                f"{result['min_cosine']:.4f}); build with --ortPrepare=none or calibrate on "
                "representative inputs")
    elif metric == "top1" and result["mean_centered_cosine"] < cos_min:  # NaN: all constant
        raise _failed(result,
            f"CPU re-encoding moved the outputs too far: mean centered cosine "
            f"{result['mean_centered_cosine']:.4f} < {cos_min:.4f} on {rows} inputs (top-1 "
            f"agreement {result['top1_agreement']:.2%} on the {total} decisive ones); {fix}")
    if metric != "cosine" and result["top1_agreement"] < min_top1:
        what = ("detection agreement" if detector else "top-1 agreement")
        on = (f"{total} confident anchors" if detector else
              f"{total} inputs" if total == rows else f"{total} of {rows} inputs (those with "
              "a decisive top-1)")
        raise _failed(result,
            f"CPU re-encoding moved the outputs too far: {what} "
            f"{result['top1_agreement']:.2%} < {min_top1:.2%} on {on} (max abs diff "
            f"{max_diff:.3g}); {fix}")
    return result

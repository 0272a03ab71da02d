"""Re-encode a TensorRT-style Q/DQ ONNX graph so ONNX Runtime's CPU provider runs it on
integer kernels (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm), count what ORT
made of it, and check how far the outputs moved.

As exported for TensorRT (int8 symmetric Q/DQ on layer inputs only) the graph runs on float
kernels in ORT plus Q/DQ overhead, slower than FP32. :func:`reencode_for_cpu` applies the
passes of :mod:`trtqat.engines.ort_qdq_rewrite`, then compares the result with the
unmodified model on the calibration inputs (:func:`prepare_model`: else on synthetic ones,
:mod:`trtqat.engines.ort_check`) with the metric of the file's family (:func:`check_agreement`).
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
import time
from typing import Any

import numpy as np
import onnx
from onnx import helper

from trtqat.engines.hints import ORT_PASSES, read_hints
from trtqat.engines.onnx_io import has_float16
from trtqat.engines.ort_check import describe_inputs, synthetic_check_feeds
from trtqat.engines.ort_inspect import (  # noqa: F401  (re-exported)
    DATA_OPS,
    DEFAULT_MIN_COSINE,
    EMBEDDING_TASKS,
    INTEGER_OPS,
    QDQ_OPS,
    TYPED_OPS,
    AgreementError,
    Feeds,
    check_agreement,
    count_compute_nodes,
    cpu_session,
    is_embedding_output,
    optimized_model,
)
from trtqat.engines.ort_qdq_act import integer_activations
from trtqat.engines.ort_qdq_convint import integer_float_output_convs
from trtqat.engines.ort_qdq_graph import Graph
from trtqat.engines.ort_qdq_matmul import (
    fold_constants,
    fuse_matmul_epilogues,
    has_quantized_matmul,
)
from trtqat.engines.ort_qdq_moves import quantize_move_outputs
from trtqat.engines.ort_qdq_narrow import float_narrow_convs
from trtqat.engines.ort_qdq_pool import float_pools_out_of_range
from trtqat.engines.ort_qdq_rewrite import (
    fold_batchnorm_nodes,
    prequantize_weights,
    quantize_gemm_bias,
    reducemean_to_gap,
    reencode_uint8,
    unify_quantizers,
)
from trtqat.engines.ort_qdq_units import absorb_clips, complete_units
from trtqat.engines.ort_u8s8 import (
    REENCODED_KEY,
    cpu_int8_info,
    exact_weights,
    u8s8_saturates,
)
from trtqat.engines.ort_verdict import (  # noqa: F401  (BUILD_THREADS re-exported)
    BUILD_THREADS,
    agreement_text,
    both_failed,
    verdict_record,
)

log = logging.getLogger(__name__)

# passes the faithful re-encoding leaves out: the quantizers ORT's fused integer Add, Mul,
# Concat ... need on tensors the exported graph keeps in float (each one more rounding)
FAITHFUL_SKIPS = ("output_quantizers", "integer_activations")


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


def _int8_activation_qs(g: Graph) -> list[str]:
    """Outputs of the activation QuantizeLinear nodes with an int8 zero-point."""
    out = []
    for n in g.graph.node:
        if n.op_type == "QuantizeLinear" and not g.is_const(n.input[0]) and len(n.input) > 2:
            zp = g.const(n.input[2])
            if zp is not None and zp.dtype == np.int8:
                out.append(n.output[0])
    return out


def _uint8_zero_point_0(g: Graph, names: list[str]) -> set[str]:
    """Those of ``names`` (Q outputs) whose Q now has a uint8 zero-point 0."""
    found = set()
    for name in names:
        q = g.producer.get(name)
        if q is None or len(q.input) < 3:
            continue
        zp = g.const(q.input[2])
        if zp is not None and zp.dtype == np.uint8 and zp.size == 1 and int(zp.reshape(())) == 0:
            found.add(name)
    return found


def reencode_for_cpu(model: onnx.ModelProto, calib_feeds: Feeds | None, *,
                     min_top1: float = 0.99, unify: bool = True, threads: int = 2,
                     count_nodes: bool = True, min_cosine: float | None = None,
                     u8s8_exact: bool | None = None, faithful: bool = False,
                     check_feeds: Feeds | None = None
                     ) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Rewrite a TensorRT-style Q/DQ ``model`` for ORT's CPU integer kernels.

    ``calib_feeds`` (input name -> array dicts) calibrate the Q/DQ the rewrite adds and are
    the inputs of the agreement check against ``model`` (:class:`AgreementError` when top-1
    agreement of a classifier is below ``min_top1``, or the mean cosine of embedding outputs
    below ``min_cosine``, default 0.98); without them added ranges come from neighbouring
    quantizers and nothing is checked, unless ``check_feeds`` (then the check's inputs,
    calibrating nothing: :func:`prepare_model` passes synthetic ones). An
    :class:`AgreementError` carries the graph it checked as ``model``. ``unify`` gives a
    tensor read by several Q nodes one Q (the largest scale). ``u8s8_exact`` False stores the weights of integer GEMMs whose
    activation can exceed 127 steps as uint8 (see :mod:`trtqat.engines.ort_u8s8`); None
    measures whether this CPU needs it. ``faithful`` adds no quantizer the graph did not
    have (:data:`FAITHFUL_SKIPS`: a residual Add then runs in float after an integer conv
    with a float output) and keeps every ReLU6 on the exported grid: slower, closer.
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
    if faithful:
        run -= set(FAITHFUL_SKIPS)
        report["faithful"] = True
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
    if "float_narrow_convs" in run:
        passes["narrow_convs_float"] = float_narrow_convs(g)
    if "integer_activations" in run:
        passes["activations_integer"] = integer_activations(
            g, _ranges_fn(g.model, feeds, threads) if feeds else None)
    if "output_quantizers" in run:
        ranges = _ranges_fn(g.model, feeds, threads) if feeds else None
        passes["output_quantizers_added"] = complete_units(g, ranges, unify)
    saturates = u8s8_saturates() if u8s8_exact is None else not u8s8_exact
    if "absorb_clips" in run:
        passes["clips_absorbed"] = absorb_clips(g, integer=saturates or faithful)
    seven_bit: set[str] = set()
    if "reencode_uint8" in run:
        int8_qs = _int8_activation_qs(g)
        passes["activations_reencoded"] = reencode_uint8(g)
        g.reindex()
        seven_bit = _uint8_zero_point_0(g, int8_qs)
    if "quantize_move_outputs" in run:
        passes["move_outputs_quantized"] = quantize_move_outputs(g)
    if "quantize_gemm_bias" in run:
        passes["gemm_bias_quantized"] = quantize_gemm_bias(g)
    if matmul_graph and "fuse_matmul_epilogues" in run:
        passes["matmul_epilogues"] = fuse_matmul_epilogues(g)
    if "float_output_convs" in run:
        passes["float_output_convs_integer"] = integer_float_output_convs(g)
    # not a pass either: ORT's QLinearGlobalAveragePool throws at run time on such scales
    if floated := float_pools_out_of_range(g):
        report["pools_in_float"] = floated
    report["cpu"] = dict(cpu_int8_info(), u8s8_saturates=saturates)
    if saturates:  # not a pass a family chooses: the integer kernels here need it
        g.reindex()
        report["cpu"]["uint8_weights"] = exact_weights(g, seven_bit)
    new_model = g.model
    onnx.checker.check_model(new_model)
    report.update(rewritten=True, passes=passes,
                  skipped_passes=[p for p in ORT_PASSES if p not in run])
    if count_nodes:
        report["compute_nodes"] = {
            "before": count_compute_nodes(optimized_model(model, threads)),
            "after": count_compute_nodes(optimized_model(new_model, threads)),
        }
    check = list(check_feeds) if check_feeds else feeds
    if check:
        try:
            report["agreement"] = check_agreement(model, new_model, check, min_top1, threads,
                                                  min_cosine)
        except AgreementError as exc:
            exc.model = new_model  # for the user to inspect
            raise
    report["seconds"] = round(time.perf_counter() - start, 3)
    log.info("CPU re-encoding: %s", report)
    return new_model, report


# report entries that vary from build to build and stay out of the engine file
_UNSTABLE = ("seconds",)


def prepare_model(model: onnx.ModelProto, options: Any = None) -> onnx.ModelProto:
    """The ORT backend's pre-session step: :func:`reencode_for_cpu` for TensorRT-style Q/DQ
    graphs, unchanged otherwise.

    Reads, when present on ``options``: ``calib_feeds``, ``min_top1``, ``min_cosine``,
    ``cpu_reencode`` (False skips the rewrite), ``u8s8_guard`` (False keeps
    int8 weights where ORT's u8s8 kernels may saturate). When the re-encoding fails the
    agreement check, the ``faithful`` one is built instead (its report says why under
    ``full_reencoding``); when that fails too, :class:`AgreementError` is raised
    (:func:`~trtqat.engines.ort_verdict.both_failed`). Without ``calib_feeds`` the check runs
    on :func:`~trtqat.engines.ort_check.synthetic_check_feeds`, which the log and the
    verdict name. The report
    (with ``verdict``: :func:`verdict_record`) is logged and stored in the model's metadata
    under ``trtqat.cpu_reencode``, without its timing: the same model and options give the
    same bytes. ORT runs on :data:`BUILD_THREADS` threads here, whatever ``threads`` says.
    """
    if not getattr(options, "cpu_reencode", True):
        return model
    feeds = list(getattr(options, "calib_feeds", None) or [])
    kwargs = {"min_top1": getattr(options, "min_top1", 0.99),
              "threads": BUILD_THREADS,
              "min_cosine": getattr(options, "min_cosine", None),
              "u8s8_exact": None if getattr(options, "u8s8_guard", True) else True}
    synthetic: dict[str, Any] | None = None
    if not feeds and is_tensorrt_qdq(model):  # no calibration inputs: check on synthetic ones
        kwargs["check_feeds"], synthetic = synthetic_check_feeds(model, options)
        log.info("CPU re-encoding: no calibration inputs; checking it on %s",
                 describe_inputs(synthetic))
    try:
        new_model, report = reencode_for_cpu(model, feeds, **kwargs)
        verdict = verdict_record(feeds, kwargs, report.get("agreement"), synthetic=synthetic)
    except AgreementError as exc:  # added requantization moved the outputs: do without it
        first = str(exc).splitlines()[0]
        try:
            new_model, report = reencode_for_cpu(model, feeds, faithful=True, **kwargs)
        except AgreementError as again:
            raise both_failed(exc, again, kwargs, "calibration inputs" if feeds else
                               "synthetic inputs (no calibration inputs given)") from None
        verdict = verdict_record(feeds, kwargs, exc.agreement, report.get("agreement"),
                                 synthetic)
        report["full_reencoding"] = first
        reason = first.split(": ", 1)[-1].split(";")[0]
        log.warning("CPU re-encoding: the fully integer graph moved the outputs too far on %s "
                    "(%s); built the faithful one instead (no quantizers added: residual Adds "
                    "and the like run in float, slower), %s",
                    "calibration inputs" if feeds else "synthetic inputs", reason,
                    agreement_text(report.get("agreement") or {}))
    if report.get("rewritten"):
        report["verdict"] = verdict
        stable = {k: v for k, v in report.items() if k not in _UNSTABLE}
        entry = new_model.metadata_props.add()
        entry.key = REENCODED_KEY
        entry.value = json.dumps(stable, default=str, sort_keys=True)
    return new_model

"""``export_onnx``: a PyTorch model to a checked FP32 / FP16 / INT8 or FP8 Q/DQ ONNX file.

One exporter for every model family: an :class:`ExportPlan` says what differs (example
inputs and names, dynamic shapes, validation batches, the checks: top-1 and noise floor
for classifiers, cosine for embeddings; see :mod:`trtqat.export.checks`). Each file is
written to a temporary name in the target folder, checked (onnx.checker, shape inference,
ONNX Runtime against PyTorch, the Q/DQ lint for INT8 and FP8) and only then renamed; a failed
check leaves no file. FP8 E4M3 Q/DQ: see :mod:`trtqat.export.fp8_qdq`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from trtqat.export import criterion as crit
from trtqat.export import validate as val
from trtqat.export._torch_export import (
    EXPORT_OPSET,
    image_dynamic_shapes,
    name_nodes,
    torch_to_onnx,
)
from trtqat.export.checks import CheckContext, classifier_checks
from trtqat.export.float_fallback import fallback_note, layers_without_int8_form
from trtqat.export.fold_bn import fold_batchnorm
from trtqat.export.fp8_qdq import (
    DEFAULT_FP8_WEIGHTS,
    check_fp8_weights,
    check_variant_format,
    to_fp8_qdq,
)
from trtqat.export.fp16 import check_io_dtype, clip_to_fp16_range, convert_to_fp16
from trtqat.export.inputs import (
    as_inputs,
    check_io_names,
    make_example_inputs,
    named_inputs,
    validation_inputs,
)
from trtqat.export.int4_weights import int4_initializers
from trtqat.export.lint import lint_model
from trtqat.export.opset import convert_opset, lowest_working_opset
from trtqat.export.prepare import as_deployed, check_quantizers, prepare, skipped_layers
from trtqat.export.qdq_weights import quantize_weights
from trtqat.export.result import ExportResult, check_writable, refuse_foreign_onnx, write_checked
from trtqat.export.variant_args import check_args, target_opset
from trtqat.finite import check_finite_arrays, model_tensors
from trtqat.outputs import flatten
from trtqat.progress import progress as progress_of
from trtqat.quant.blockwise import export_blocks
from trtqat.quant.model_ops import disable_layers, quantizers
from trtqat.quant.own_forward import fold_effective_weights
from trtqat.variants import variant as variant_row

log = logging.getLogger(__name__)

Checks = Callable[[str, list, list, CheckContext], list[val.Check]]


@dataclass
class ExportPlan:
    """What one model's export needs; a model family builds it (``family.export_plan``)."""

    inputs: tuple[torch.Tensor, ...]              # traced example, forward() order
    input_names: list[str] | None = None          # None: input / input_<i>
    output_names: list[str] | None = None         # None: output / output_<i>
    dynamic_shapes: tuple[dict, ...] | None = None  # torch.export Dims per input
    dynamic_batch: bool = True                    # axis 0 dynamic (without dynamic_shapes)
    dynamic_axes: tuple[str, ...] = ("batch",)    # reported in the result
    batch: int | None = None                      # fixed batch: validation re-chunked to it
    validation: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    check_example: bool = True                    # validate on the traced example too
    checks: Checks = classifier_checks            # see trtqat.export.checks
    fold_bn: bool = True
    clip_fp16: bool = False                       # clip float constants to fp16's range
    metadata: dict[str, str] = field(default_factory=dict)  # added to every file
    float32_ops: tuple[str, ...] = ()             # ONNX ops kept float32 in fp16 variants
    # output name -> (label, axis, start, stop) parts checked each on its own scale
    output_slices: dict[str, tuple[tuple[str, int, int, int], ...]] = field(
        default_factory=dict)


def image_plan(example_inputs: Any, *, dynamic_batch: bool = True,
               validation_data: Iterable | None = None,
               dynamic_axes: Iterable[str] | None = None, fold_bn: bool = True) -> ExportPlan:
    """The plan of an image model: ``dynamic_axes`` (of batch, height, width) overrides
    ``dynamic_batch``; ``validation_data`` holds batches or ``(inputs, labels)``."""
    inputs = as_inputs(example_inputs)
    axes = (("batch",) if dynamic_batch else ()) if dynamic_axes is None else tuple(dynamic_axes)
    dynamic_batch = "batch" in axes
    if dynamic_batch and inputs[0].shape[0] == 1:
        # torch.export specialises a size-1 dimension; trace with two rows instead
        inputs = tuple(torch.cat([t, t]) for t in inputs)
    data = []
    for batch in validation_data or []:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        data.append((x.float().cpu(),) if isinstance(x, torch.Tensor) else tuple(x))
    return ExportPlan(inputs, dynamic_shapes=(image_dynamic_shapes(axes, len(inputs))
                                              if set(axes) - {"batch"} else None),
                      dynamic_batch=dynamic_batch, dynamic_axes=axes,
                      batch=None if dynamic_batch else int(inputs[0].shape[0]),
                      validation=data, fold_bn=fold_bn)


def model_plan(model: nn.Module, example_inputs: Any, *, dynamic_batch: bool = True,
               validation_data: Iterable | None = None,
               dynamic_axes: Iterable[str] | None = None, fold_bn: bool = True,
               checks: Checks = classifier_checks) -> ExportPlan:
    """:func:`image_plan` of ``model`` whose example and validation inputs may also be dicts
    by ``forward`` argument name (their keys name the ONNX inputs), checked by ``checks``."""
    inputs, names = named_inputs(model, example_inputs)
    plan = image_plan(inputs, dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes,
                      fold_bn=fold_bn)
    plan.input_names, plan.validation = names, validation_inputs(model, validation_data)
    plan.checks = checks
    return plan


def io_names(n_in: int, n_out: int) -> tuple[list[str], list[str]]:
    """Default ONNX input and output names: ``input``/``output``, numbered when several."""
    ins = ["input"] if n_in == 1 else [f"input_{i}" for i in range(n_in)]
    outs = ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)]
    return ins, outs


def finish_model(model: onnx.ModelProto, variant: str, opset: int, io_dtype: str = "float32",
                 min_codes: dict[str, int] | None = None,
                 float32_ops: Sequence[str] = (), int4_blocks: list | None = None,
                 fp8_weights: str = DEFAULT_FP8_WEIGHTS) -> onnx.ModelProto:
    """A copy of a traced graph as ``variant``: int8 weight initializers (FP8: E4M3 Q/DQ,
    weights as ``fp8_weights`` says; INT4: weights from ``int4_blocks``,
    :mod:`trtqat.export.int4_weights`), ``opset``, fp16 (``float32_ops`` kept float32),
    producer, ``trtqat.variant``/``trtqat.opset`` metadata and graph name."""
    row = variant_row(variant)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if row.int8:
        quantize_weights(out, min_codes=min_codes)
    out = convert_opset(out, opset)
    if row.format == "int4":
        int4_initializers(out, int4_blocks or [])
    if row.format == "fp8":
        to_fp8_qdq(out, fp8_weights)
    if row.fp16:
        out = convert_to_fp16(out, io_dtype, float32_ops)
    out.producer_name = "trtqat"
    props = {"trtqat.variant": variant, "trtqat.opset": str(opset)}
    del out.metadata_props[:]
    for k, v in props.items():
        out.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    out.graph.name = f"trtqat_{variant.replace('-', '_')}"
    return out


# ------------------------------------------------------------------ writing
class Exporter:
    """Exports one model to several variants, sharing the (slow) torch.export runs.

    One float graph serves fp32 and fp16, one Q/DQ graph serves the quantized variants of the
    model's format (int8 and int8-fp16, or fp8 and fp8-fp16); the
    PyTorch reference outputs are computed once per graph too. ``example_inputs`` is an
    :class:`ExportPlan` (any family) or example image tensors (see :func:`image_plan`).
    """

    def __init__(self, model: nn.Module, example_inputs: Any, *, dynamic_batch: bool = True,
                 fold_bn: bool = True, validation_data: Iterable | None = None,
                 dynamic_axes: Iterable[str] | None = None) -> None:
        # quantizer ranges are checked per INT8 variant (check_quantizers, with a fix)
        check_finite_arrays(((n, t) for n, t in model_tensors(model) if "_quantizer" not in n),
                            "the model to export", "no file written; export a checkpoint "
                            "trained with a lower --lr")
        self.model = model
        self.plan = example_inputs if isinstance(example_inputs, ExportPlan) else model_plan(
            model, example_inputs, dynamic_batch=dynamic_batch, validation_data=validation_data,
            dynamic_axes=dynamic_axes, fold_bn=fold_bn)
        self.inputs = self.plan.inputs
        check_io_names(self.plan.input_names, None, len(self.inputs), [])  # before any file
        if self.plan.output_names:  # counted on a float copy, before any file is written
            with torch.no_grad():
                outs = [n for n, _ in flatten(prepare(model, False)(*self.inputs))]
            check_io_names(None, self.plan.output_names, 0, outs)
        self.dynamic_axes = self.plan.dynamic_axes
        self.dynamic_batch = self.plan.dynamic_batch
        self.batch = self.plan.batch
        self.skip_layers = skipped_layers(model)
        self._graphs: dict[bool, tuple[onnx.ModelProto, nn.Module]] = {}
        self._traced: dict[bool, nn.Module] = {}
        self._refs: dict[bool, list] = {}
        self._floors: dict[bool, list | None] = {}
        self.notes: list[str] = []  # e.g. layers left in float automatically
        self.fold_notes: list[str] = []  # BatchNorms left unfolded, and why
        self._batches: list | None = None
        self._out_names: list[str] = list(self.plan.output_names or [])

    def _graph(self, int8: bool) -> tuple[onnx.ModelProto, nn.Module]:
        if int8 not in self._graphs:
            reference = prepare(self.model, int8)
            proto, traced = self._trace(reference)
            fallback = layers_without_int8_form(proto) if int8 else []
            if fallback:  # e.g. an adaptive pooling that upsamples (a GatherND)
                disable_layers(reference, fallback)
                self.skip_layers = tuple(dict.fromkeys([*self.skip_layers, *fallback]))
                self.notes.append(fallback_note(fallback))
                log.warning("%s", self.notes[-1])
                proto, traced = self._trace(reference)
            self._graphs[int8] = (proto, reference)
            self._traced[int8] = traced
        return self._graphs[int8]

    def _trace(self, reference: nn.Module) -> tuple[onnx.ModelProto, nn.Module]:
        plan = self.plan
        traced = (fold_batchnorm(reference, example_inputs=self.inputs, notes=self.fold_notes)
                  if plan.fold_bn else reference)
        # own-forward layers (weight standardisation): their weight a constant, so the graph
        # has DQ(Q(W_eff)) and no float ops computing it (after BN folding, which changes it)
        fold_effective_weights(traced, lambda m: m(*self.inputs))
        with torch.no_grad():
            sample = [n for n, _ in flatten(traced(*self.inputs))]
        check_io_names(plan.input_names, plan.output_names, len(self.inputs), sample)
        ins = plan.input_names or io_names(len(self.inputs), 1)[0]
        outs = plan.output_names or sample
        self._out_names = list(outs)
        proto = torch_to_onnx(traced, self.inputs, self.dynamic_batch, ins, outs,
                              plan.dynamic_shapes)
        name_nodes(proto.graph)
        return proto, traced

    def _validation_batches(self) -> list:
        """``(inputs, n_valid, counts_for_top1)``: the example inputs, then the data."""
        if self._batches is None:
            first = [self.inputs] if self.plan.check_example else []
            self._batches = [(b, n, False) for b, n in val.rebatch(first, self.batch)]
            self._batches += [(b, n, True) for b, n in val.rebatch(self.plan.validation,
                                                                   self.batch)]
        return self._batches

    def _reference(self, int8: bool, reference: nn.Module) -> list:
        if int8 not in self._refs:
            self._refs[int8] = [self._split(val.run_torch(reference, b))
                                for b, _, _ in self._validation_batches()]
        return self._refs[int8]

    def _split(self, arrays: list) -> list:
        """``arrays`` with each output the plan slices replaced by its slices."""
        return val.split_outputs(arrays, self._out_names, self.plan.output_slices)[1]

    def export(self, path: str | os.PathLike, variant: str = "int8", opset: int | None = None,
               *,
               io_dtype: str = "float32", validate: bool = True,
               metadata: dict[str, str] | None = None,
               fp8_weights: str = DEFAULT_FP8_WEIGHTS) -> ExportResult:
        """Write one variant to ``path`` (checked first; see :func:`export_onnx`);
        ``metadata`` is added to the file's (next to ``trtqat.variant``, ...)."""
        check_args(variant, opset)
        check_io_dtype(io_dtype)
        check_fp8_weights(fp8_weights)
        check_variant_format(self.model, variant, variant_row(variant).format)
        path = Path(path)
        refuse_foreign_onnx(path)  # trtqat replaces only its own exports
        check_writable(path.parent)
        quantized = int8 = variant_row(variant).quantized  # any format: the Q/DQ graph
        opset = target_opset(variant, opset)
        base, reference = self._graph(quantized)
        if self.plan.clip_fp16 and variant_row(variant).fp16:
            base = clip_to_fp16_range(base)
        min_codes = ({n: q.minbound for n, q in quantizers(self._traced[int8])}
                     if variant_row(variant).int8 else None)
        blocks = (export_blocks(self._traced[True]) if variant_row(variant).format == "int4"
                  else None)
        model, opset, raised = lowest_working_opset(
            lambda o: finish_model(base, variant, o, io_dtype, min_codes,
                                   self.plan.float32_ops, blocks, fp8_weights), opset)
        props = dict(self.plan.metadata)
        if int8 and self.skip_layers:  # read by the lint: these layers are float on purpose
            props["trtqat.skip_layers"] = ",".join(self.skip_layers)
        for key, value in {**props, **(metadata or {})}.items():
            model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=str(value)))
        result = ExportResult(path, variant, opset, self.dynamic_batch,
                              notes=[*raised, *self.fold_notes, *(self.notes if int8 else [])],
                              dynamic_axes=self.dynamic_axes)
        check = (lambda tmp: self._validate(tmp, variant, reference, result)) if validate else None
        return write_checked(model, result, check)

    def _validate(self, tmp: str, variant: str, reference: nn.Module,
                  result: ExportResult) -> None:
        session = val.ort_session(tmp)
        int8 = variant_row(variant).qdq  # Q/DQ on activations: its checks and the lint
        refs = self._reference(variant_row(variant).quantized, reference)
        batches = self._validation_batches()
        gots, wants = [], []
        for (batch, n, _), ref in progress_of(zip(batches, refs), total=len(batches),
                                              desc=f"check {variant}", brief=True):
            gots.append([g[:n] for g in self._split(val.run_ort(session, batch))])
            wants.append([r[:n] for r in ref])
        context = CheckContext(
            names=val.split_outputs([], [o.name for o in session.get_outputs()],
                                    self.plan.output_slices)[0],
            batches=[tuple(t[:n] for t in b) for b, n, _ in batches],
            counted=[c for _, _, c in batches],
            noise_floor=lambda: self._noise_floor(reference),
            half_floor=lambda: crit.half_floor(reference, batches, refs, split=self._split,
                                               dtype=crit.floor_dtype(variant)),
            traced=self._traced[True] if int8 else None, onnx_path=tmp)
        result.checks += self.plan.checks(variant, wants, gots, context)
        if int8:
            result.lint = lint_model(tmp)

    def _noise_floor(self, reference: nn.Module) -> list | None:
        """The INT8 reference in float64 against float32, measured once (see criterion)."""
        if True not in self._floors:
            self._floors[True] = crit.noise_floor(crit.float64_reference(reference),
                                                  self._validation_batches(),
                                                  self._reference(True, reference),
                                                  split=self._split)
        return self._floors[True]


def export_onnx(model: nn.Module, example_inputs: Any, path: str | os.PathLike,
                variant: str = "int8", opset: int | None = None, dynamic_batch: bool = True,
                *,
                io_dtype: str = "float32", fold_bn: bool = True, validate: bool = True,
                validation_data: Iterable | None = None,
                dynamic_axes: Iterable[str] | None = None,
                metadata: dict[str, str] | None = None,
                output_slices: dict[str, Sequence[tuple[str, int, int, int]]] | None = None,
                fp8_weights: str = DEFAULT_FP8_WEIGHTS) -> ExportResult:
    """Export ``model`` as one ONNX ``variant`` (fp32, fp16, int8, int8-fp16, fp8, fp8-fp16)
    to ``path``.

    The exporter itself, with the classifier checks unless ``example_inputs`` is a plan;
    ``trtqat.export_onnx`` adds what the model's family needs (its plan and checks).
    ``example_inputs``: an :class:`ExportPlan`, or a tensor, tuple of tensors or dict of
    tensors by ``forward`` argument name (their batch size is the fixed batch when
    ``dynamic_batch`` is False). INT8 variants need calibrated
    quantizers; fp32/fp16 run with quantizers disabled. BatchNorm is folded first
    (``fold_bn``). Unless ``validate`` is False the file is checked against PyTorch on the
    example inputs and on ``validation_data`` (an iterable of batches or ``(inputs,
    labels)``), plus the Q/DQ lint for INT8; a failure raises :class:`ValidationError` and
    keeps no file. ``dynamic_axes`` (of ``batch``, ``height``, ``width``) replaces
    ``dynamic_batch`` for image inputs, e.g. ``("batch", "height", "width")``; ``metadata``
    is added to the file's. ``output_slices`` ({output name: ((label, axis, start, stop),
    ...)}) checks parts of an output each on its own scale (a detector's boxes and scores).
    Returns the :class:`ExportResult` (path, opset, every check).
    """
    exporter = Exporter(model, example_inputs, dynamic_batch=dynamic_batch, fold_bn=fold_bn,
                        validation_data=validation_data, dynamic_axes=dynamic_axes)
    if output_slices:
        exporter.plan.output_slices = {k: tuple(tuple(p) for p in v)
                                       for k, v in output_slices.items()}
    return exporter.export(path, variant, opset, io_dtype=io_dtype, validate=validate,
                           metadata=metadata, fp8_weights=fp8_weights)


__all__ = ["EXPORT_OPSET", "ExportPlan", "ExportResult", "Exporter", "as_deployed", "as_inputs",
           "check_quantizers", "check_writable", "convert_opset", "export_onnx",
           "finish_model", "image_plan", "make_example_inputs", "model_plan", "prepare",
           "quantize_weights"]

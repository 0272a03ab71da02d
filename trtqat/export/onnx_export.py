"""``export_onnx``: a PyTorch model to a checked FP32 / FP16 / INT8 Q/DQ / INT8+FP16 ONNX file.

Each file is written to a temporary name in the target folder, checked (onnx.checker, shape
inference, ONNX Runtime against PyTorch, the Q/DQ lint for INT8) and only then renamed; a
failed check leaves no file.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from trtqat.export import criterion as crit
from trtqat.export import validate as val
from trtqat.export._graph import GraphIndex, attr
from trtqat.export._torch_export import (
    EXPORT_OPSET,
    image_dynamic_shapes,
    name_nodes,
    torch_to_onnx,
)
from trtqat.export.calibrated import refuse_uncalibrated
from trtqat.export.errors import ExportError
from trtqat.export.float_fallback import fallback_note, layers_without_int8_form
from trtqat.export.fold_bn import fold_batchnorm
from trtqat.export.fp16 import convert_to_fp16
from trtqat.export.lint import lint_model
from trtqat.export.naming import FP16_VARIANTS, INT8_VARIANTS, VARIANTS
from trtqat.export.opset import convert_opset
from trtqat.export.qdq_check import check_qdq_inventory
from trtqat.export.result import ExportResult, check_writable, write_checked
from trtqat.finite import check_finite_arrays, model_tensors
from trtqat.quant.model_ops import disable_layers, quantizers
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)

MIN_OPSET = 13
FP16_QDQ_OPSET = 19  # fp16 Q/DQ scales


# ------------------------------------------------------------------ model preparation
def check_quantizers(model: nn.Module) -> int:
    """Refuse INT8 export of a model whose quantizers are missing or uncalibrated.

    Returns the number of active quantizers.
    """
    refuse_uncalibrated(model)
    active = [(n, q) for n, q in quantizers(model) if not q.disabled and q._if_quant]
    if not active:
        raise ExportError("the model has no active quantizer, so there is nothing to export "
                          "as INT8: run `trtqat calibrate` (PTQ) or `trtqat qat` first, or "
                          "export --variant fp32/fp16")
    for name, q in active:
        layer = name.rsplit(".", 1)[0] if "." in name else name
        hint = (f"calibrate the model (`trtqat calibrate`) or leave layer '{layer}' in float "
                f"(--skip-layers {layer})")
        amax = q.amax
        if amax is None:
            raise ExportError(f"quantizer '{name}' is not calibrated (amax is missing): {hint}")
        if not bool(torch.isfinite(amax).all()):
            raise ExportError(f"quantizer '{name}' has a NaN or infinite amax: {hint}")
        if bool((amax <= 0).all()):
            raise ExportError(f"quantizer '{name}' has amax 0, so it represents nothing: "
                              f"{hint}")
        if bool((amax < 0).any()):
            raise ExportError(f"quantizer '{name}' has a negative amax: {hint}")
    return len(active)


def as_deployed(model: nn.Module) -> int:
    """Make signed narrow-range activation quantizers clip at -128 (in place); returns how
    many changed.

    ONNX QuantizeLinear and TensorRT clip int8 to [-128, 127] whatever the training
    range was, so a narrow-range ([-127, 127]) activation that falls below ``-amax`` on new
    data becomes -128 in the file and -127 in PyTorch. The scale (``amax / 127``) is the
    same. The exported reference computes what the file and TensorRT compute; a full-range
    quantizer is unchanged. Weights are stored as int8 codes in their own range.
    """
    count = 0
    for name, q in quantizers(model):
        if name.endswith("_weight_quantizer") or q.unsigned or not q.narrow_range:
            continue
        q._narrow_range = False
        q._qmin = -q._qmax - 1
        count += 1
    return count


def prepare(model: nn.Module, int8: bool) -> nn.Module:
    """An eval-mode copy: quantizers checked (INT8, activations clipped as deployed, see
    :func:`as_deployed`) or disabled (float), no gradients."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    if int8:
        check_quantizers(ref)
        as_deployed(ref)
    else:
        for m in ref.modules():
            if isinstance(m, TensorQuantizer):
                m.disable()
    return ref


def _as_inputs(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ExportError("example_inputs must be a tensor or a tuple of tensors")
    return tuple(t.detach().float().cpu() for t in inputs)


def _io_names(n_in: int, n_out: int) -> tuple[list[str], list[str]]:
    ins = ["input"] if n_in == 1 else [f"input_{i}" for i in range(n_in)]
    outs = ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)]
    return ins, outs


# ------------------------------------------------------------------ graph passes
def quantize_weights(model: onnx.ModelProto, min_codes: dict[str, int] | None = None) -> int:
    """Replace ``Q(float weight) -> DQ`` by an int8 weight initializer -> DQ (in place).

    The codes are computed once, as the PyTorch quantizer does (round half to even, clipped
    to [min, 127]: min is the quantizer's own, from ``min_codes`` by quantizer name, else
    -128 as the QuantizeLinear being replaced saturates); the file holds 1 byte per weight, and TensorRT reads DQ on
    int8 constants as quantized weights. Returns the number of weights converted.
    """
    graph = model.graph
    g = GraphIndex(graph)
    drop, count = set(), 0
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] not in g.initializers:
            continue
        users = g.consumers.get(node.output[0], [])
        scale = g.constant(node.input[1])
        if not users or any(u.op_type != "DequantizeLinear" for u in users) or scale is None:
            continue
        w = numpy_helper.to_array(g.initializers[node.input[0]]).astype(np.float32)
        if scale.size > 1:
            shape = [1] * w.ndim
            shape[attr(node, "axis", 1) % w.ndim] = -1
            scale = scale.reshape(shape)
        low = (min_codes or {}).get(node.name.split("/")[0], -128)
        codes = np.clip(np.rint(w / scale.astype(np.float32)), low, 127).astype(np.int8)
        name = f"{node.input[0]}_int8"
        graph.initializer.append(numpy_helper.from_array(codes, name))
        for u in users:
            u.input[0] = name
        drop.add(id(node))
        count += 1
    if drop:
        kept = [n for n in graph.node if id(n) not in drop]
        del graph.node[:]
        graph.node.extend(kept)
        used = {i for n in graph.node for i in n.input}
        live = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(live)
    return count


def skipped_layers(model: nn.Module) -> tuple[str, ...]:
    """Layers left in float on purpose: ``model.trtqat_skip_layers`` (the ``--skip-layers``
    patterns) if set, else the owners of the disabled quantizers of a quantized model."""
    explicit = getattr(model, "trtqat_skip_layers", None)
    if explicit is not None:
        return tuple(explicit)
    names = [n for n, q in quantizers(model) if q.disabled]
    if len(names) == sum(1 for _ in quantizers(model)):
        return ()  # nothing quantized (a float model): nothing left out on purpose
    owners = [n.rsplit(".", 1)[0] if n.endswith(("._input_quantizer", "._weight_quantizer"))
              else n for n in names]
    return tuple(dict.fromkeys(owners))


def _finish(model: onnx.ModelProto, variant: str, opset: int, io_dtype: str,
            min_codes: dict[str, int] | None = None) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if variant in INT8_VARIANTS:
        quantize_weights(out, min_codes=min_codes)
    out = convert_opset(out, opset)
    if variant in FP16_VARIANTS:
        out = convert_to_fp16(out, io_dtype)
    out.producer_name = "trtqat"
    props = {"trtqat.variant": variant, "trtqat.opset": str(opset)}
    del out.metadata_props[:]
    for k, v in props.items():
        out.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    out.graph.name = f"trtqat_{variant.replace('-', '_')}"
    return out


# ------------------------------------------------------------------ writing
def _target_opset(variant: str, opset: int) -> int:
    if variant == "int8-fp16" and opset < FP16_QDQ_OPSET:
        log.info("int8-fp16 uses opset %d (fp16 Q/DQ scales need it), not %d",
                 FP16_QDQ_OPSET, opset)
        return FP16_QDQ_OPSET
    return opset


def _check_args(variant: str, opset: int) -> None:
    if variant not in VARIANTS:
        raise ExportError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    top = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= top:
        raise ExportError(f"--opset {opset} is out of range: per-channel Q/DQ needs >= "
                          f"{MIN_OPSET}, and this onnx knows up to {top}")


class Exporter:
    """Exports one model to several variants, sharing the (slow) torch.export runs.

    One float graph serves fp32 and fp16, one Q/DQ graph serves int8 and int8-fp16; the
    PyTorch reference outputs are computed once per graph too.
    """

    def __init__(self, model: nn.Module, example_inputs: Any, *, dynamic_batch: bool = True,
                 fold_bn: bool = True, validation_data: Iterable | None = None,
                 dynamic_axes: Iterable[str] | None = None) -> None:
        # quantizer ranges are checked per INT8 variant (check_quantizers, with a fix)
        check_finite_arrays(((n, t) for n, t in model_tensors(model) if "_quantizer" not in n),
                            "the model to export", "no file written; export a checkpoint "
                            "trained with a lower --lr")
        self.model = model
        self.inputs = _as_inputs(example_inputs)
        # dynamic_axes (batch, height, width of image inputs) overrides dynamic_batch
        self.dynamic_axes = (("batch",) if dynamic_batch else ()) if dynamic_axes is None \
            else tuple(dynamic_axes)
        dynamic_batch = "batch" in self.dynamic_axes
        self.dynamic_batch = dynamic_batch
        self.fold_bn = fold_bn
        if dynamic_batch and self.inputs[0].shape[0] == 1:
            # torch.export specialises a size-1 dimension; trace with two rows instead
            self.inputs = tuple(torch.cat([t, t]) for t in self.inputs)
        self.batch = None if dynamic_batch else int(self.inputs[0].shape[0])
        self.validation_data = validation_data
        self.skip_layers = skipped_layers(model)
        self._graphs: dict[bool, tuple[onnx.ModelProto, nn.Module]] = {}
        self._traced: dict[bool, nn.Module] = {}
        self._refs: dict[bool, list] = {}
        self._floors: dict[bool, list | None] = {}
        self.notes: list[str] = []  # e.g. layers left in float automatically
        self._batches: list | None = None

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
        traced = fold_batchnorm(reference) if self.fold_bn else reference
        with torch.no_grad():
            sample = traced(*self.inputs)
        n_out = len(sample) if isinstance(sample, (tuple, list)) else 1
        names = _io_names(len(self.inputs), n_out)
        shapes = (image_dynamic_shapes(self.dynamic_axes, len(self.inputs))
                  if set(self.dynamic_axes) - {"batch"} else None)
        proto = torch_to_onnx(traced, self.inputs, self.dynamic_batch, *names, shapes)
        name_nodes(proto.graph)
        return proto, traced

    def _validation_batches(self) -> list:
        """``(inputs, n_valid, is_validation_data)``: the example inputs, then the data."""
        if self._batches is None:
            data = []
            for batch in self.validation_data or []:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                data.append((x.float().cpu(),) if isinstance(x, torch.Tensor) else tuple(x))
            self._batches = [(b, n, False) for b, n in val.rebatch([self.inputs], self.batch)]
            self._batches += [(b, n, True) for b, n in val.rebatch(data, self.batch)]
        return self._batches

    def _reference(self, int8: bool, reference: nn.Module) -> list:
        if int8 not in self._refs:
            self._refs[int8] = [val.run_torch(reference, b)
                                for b, _, _ in self._validation_batches()]
        return self._refs[int8]

    def export(self, path: str | os.PathLike, variant: str = "int8", opset: int = 17, *,
               io_dtype: str = "float32", validate: bool = True) -> ExportResult:
        """Write one variant to ``path`` (checked first; see :func:`export_onnx`)."""
        _check_args(variant, opset)
        path = Path(path)
        check_writable(path.parent)
        int8 = variant in INT8_VARIANTS
        opset = _target_opset(variant, opset)
        base, reference = self._graph(int8)
        min_codes = {n: q.minbound for n, q in quantizers(self._traced[int8])} if int8 else None
        model = _finish(base, variant, opset, io_dtype, min_codes)
        if int8 and self.skip_layers:  # read by the lint: these layers are float on purpose
            model.metadata_props.append(onnx.StringStringEntryProto(
                key="trtqat.skip_layers", value=",".join(self.skip_layers)))
        result = ExportResult(path, variant, opset, self.dynamic_batch,
                              notes=list(self.notes) if int8 else [],
                              dynamic_axes=self.dynamic_axes)
        check = (lambda tmp: self._validate(tmp, variant, reference, result)) if validate else None
        return write_checked(model, result, check)

    def _validate(self, tmp: str, variant: str, reference: nn.Module,
                  result: ExportResult) -> None:
        session = val.ort_session(tmp)
        refs = self._reference(variant in INT8_VARIANTS, reference)
        batches = self._validation_batches()
        pairs = []
        for (batch, n, is_data), ref in zip(batches, refs):
            got = val.run_ort(session, batch)
            pairs.append(([g[:n] for g in got], [r[:n] for r in ref], is_data))
        names = [o.name for o in session.get_outputs()]
        int8 = variant in INT8_VARIANTS
        floors = self._noise_floor(reference) if int8 else None
        result.checks += val.compare(variant, pairs, names, floors)
        if int8:
            result.checks.append(check_qdq_inventory(onnx.load(tmp), self._traced[True]))
            result.lint = lint_model(tmp)

    def _noise_floor(self, reference: nn.Module) -> list | None:
        """The INT8 reference in float64 against float32, measured once (see criterion)."""
        if True not in self._floors:
            self._floors[True] = crit.noise_floor(crit.float64_reference(reference),
                                                  self._validation_batches(),
                                                  self._reference(True, reference))
        return self._floors[True]


def export_onnx(model: nn.Module, example_inputs: Any, path: str | os.PathLike,
                variant: str = "int8", opset: int = 17, dynamic_batch: bool = True, *,
                io_dtype: str = "float32", fold_bn: bool = True, validate: bool = True,
                validation_data: Iterable | None = None,
                dynamic_axes: Iterable[str] | None = None) -> ExportResult:
    """Export ``model`` as one ONNX ``variant`` (fp32, fp16, int8, int8-fp16) to ``path``.

    ``example_inputs``: a tensor or tuple of tensors (their batch size is the fixed batch
    when ``dynamic_batch`` is False). INT8 variants need calibrated quantizers; fp32/fp16
    run with quantizers disabled. BatchNorm is folded first (``fold_bn``). Unless
    ``validate`` is False the file is checked against PyTorch on the example inputs and on
    ``validation_data`` (an iterable of batches or ``(inputs, labels)``), plus the Q/DQ lint
    for INT8; a failure raises :class:`ValidationError` and keeps no file.
    ``dynamic_axes`` (of ``batch``, ``height``, ``width``) replaces ``dynamic_batch`` for
    image inputs, e.g. ``("batch", "height", "width")``.
    Returns the :class:`ExportResult` (path, opset, every check).
    """
    exporter = Exporter(model, example_inputs, dynamic_batch=dynamic_batch, fold_bn=fold_bn,
                        validation_data=validation_data, dynamic_axes=dynamic_axes)
    return exporter.export(path, variant, opset, io_dtype=io_dtype, validate=validate)


def make_example_inputs(image_size: int | tuple[int, int], batch: int = 2, channels: int = 3,
                        seed: int = 0) -> torch.Tensor:
    """A reproducible random image batch ``(batch, channels, height, width)`` (an int size
    is square)."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, h, w, generator=gen)


__all__ = ["EXPORT_OPSET", "ExportResult", "Exporter", "check_quantizers", "check_writable",
           "convert_opset", "export_onnx", "make_example_inputs", "prepare",
           "quantize_weights"]

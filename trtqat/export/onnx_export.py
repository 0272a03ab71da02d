"""``export_onnx``: a PyTorch model to a checked FP32 / FP16 / INT8 Q/DQ / INT8+FP16 ONNX file.

Each file is written to a temporary name in the target folder, checked (onnx.checker, shape
inference, ONNX Runtime against PyTorch, the Q/DQ lint for INT8) and only then renamed; a
failed check leaves no file.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from trtqat.atomic import publish, temp_path
from trtqat.export import validate as val
from trtqat.export._graph import GraphIndex, attr
from trtqat.export._torch_export import (
    EXPORT_OPSET,
    image_dynamic_shapes,
    name_nodes,
    torch_to_onnx,
)
from trtqat.export.calibrated import refuse_uncalibrated
from trtqat.export.errors import ExportError, ValidationError
from trtqat.export.fold_bn import fold_batchnorm
from trtqat.export.fp16 import convert_to_fp16
from trtqat.export.lint import LintReport, lint_model
from trtqat.export.naming import FP16_VARIANTS, INT8_VARIANTS, VARIANTS
from trtqat.export.opset import convert_opset
from trtqat.finite import check_finite_arrays, model_tensors
from trtqat.quant.model_ops import quantizers
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)

MIN_OPSET = 13
FP16_QDQ_OPSET = 19  # fp16 Q/DQ scales


@dataclass
class ExportResult:
    """What :func:`export_onnx` wrote and how it was checked."""

    path: Path
    variant: str
    opset: int
    dynamic_batch: bool
    checks: list[val.Check] = field(default_factory=list)
    lint: LintReport | None = None
    dynamic_axes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return bool(all(c.passed for c in self.checks) and (self.lint is None or self.lint.ok))

    def lines(self) -> list[str]:
        """Per-check lines, as ``trtqat export`` prints them."""
        out = [c.line() for c in self.checks]
        if self.lint is not None:
            out.append(f"{'PASS' if self.lint.ok else 'FAIL'}  TensorRT Q/DQ lint: "
                       f"{self.lint.summary()}")
            out += [f"      {f.line()}" for f in self.lint.findings]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "variant": self.variant, "opset": self.opset,
                "dynamic_batch": self.dynamic_batch,
                "dynamic_axes": list(self.dynamic_axes), "passed": self.passed,
                "checks": [{"name": c.name, "passed": bool(c.passed), "detail": c.detail}
                           for c in self.checks],
                "lint": None if self.lint is None else self.lint.lines()}


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


def prepare(model: nn.Module, int8: bool) -> nn.Module:
    """An eval-mode copy: quantizers checked (INT8) or disabled (float), no gradients."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    if int8:
        check_quantizers(ref)
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
def quantize_weights(model: onnx.ModelProto) -> int:
    """Replace ``Q(float weight) -> DQ`` by an int8 weight initializer -> DQ (in place).

    The codes are computed once, as the QuantizeLinear they replace and the (full-range)
    PyTorch quantizer do: round half to even, saturate to [-128, 127]. Max-calibrated weights
    never reach -128; a weight range calibrated below max|w| (percentile, mse) can. The file
    holds 1 byte per weight, and TensorRT reads DQ on int8 constants as quantized weights.
    Returns the number of weights converted.
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
        codes = np.clip(np.rint(w / scale.astype(np.float32)), -128, 127).astype(np.int8)
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


def _finish(model: onnx.ModelProto, variant: str, opset: int, io_dtype: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if variant in INT8_VARIANTS:
        quantize_weights(out)
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
def write_checked(model: onnx.ModelProto, result: ExportResult,
                  validate: Callable[[str], None] | None = None) -> ExportResult:
    """Save ``model`` to a temporary file beside ``result.path``, check it, then rename it.

    ``onnx.checker`` (full check) always runs; ``validate(tmp_path)`` adds its checks and
    lint to ``result``. Any failed check raises :class:`ValidationError` and keeps no file.
    """
    path = result.path
    tmp = str(temp_path(path))
    try:
        onnx.save(model, tmp)
        onnx.checker.check_model(tmp, full_check=True)
        result.checks.append(val.Check("onnx.checker", True, "full check and strict shape "
                                       f"inference (opset {result.opset})"))
        if validate is not None:
            validate(tmp)
            if result.lint is not None:
                result.lint.source = str(path)
        if not result.passed:
            failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.passed]
            if result.lint is not None and not result.lint.ok:
                failed.append(f"lint ({result.lint.errors[0].line()})")
            raise ValidationError(f"{path.name} failed: {'; '.join(failed)}; no file kept",
                                  result)
        publish(tmp, path)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{path.name} is not valid ONNX: "
                          f"{str(exc).splitlines()[0][:300]}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return result

def check_writable(folder: str | os.PathLike) -> Path:
    """Create ``folder`` if needed and prove a file can be written there."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ExportError(f"cannot write to output folder {folder}: "
                          f"{exc.strerror or exc}") from None
    return folder


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
        self._refs: dict[bool, list] = {}
        self._batches: list | None = None

    def _graph(self, int8: bool) -> tuple[onnx.ModelProto, nn.Module]:
        if int8 not in self._graphs:
            reference = prepare(self.model, int8)
            traced = fold_batchnorm(reference) if self.fold_bn else reference
            with torch.no_grad():
                sample = traced(*self.inputs)
            n_out = len(sample) if isinstance(sample, (tuple, list)) else 1
            names = _io_names(len(self.inputs), n_out)
            shapes = (image_dynamic_shapes(self.dynamic_axes, len(self.inputs))
                      if set(self.dynamic_axes) - {"batch"} else None)
            proto = torch_to_onnx(traced, self.inputs, self.dynamic_batch, *names, shapes)
            name_nodes(proto.graph)
            self._graphs[int8] = (proto, reference)
        return self._graphs[int8]

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
        model = _finish(base, variant, opset, io_dtype)
        if int8 and self.skip_layers:  # read by the lint: these layers are float on purpose
            model.metadata_props.append(onnx.StringStringEntryProto(
                key="trtqat.skip_layers", value=",".join(self.skip_layers)))
        result = ExportResult(path, variant, opset, self.dynamic_batch,
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
        result.checks += val.finite_checks(pairs, names) + val.compare(variant, pairs, names)
        if variant in INT8_VARIANTS:
            result.lint = lint_model(tmp)


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

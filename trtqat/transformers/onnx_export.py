"""``export_encoder``: a :class:`SentenceEncoder` to a checked FP32 / FP16 / INT8 / INT8+FP16 ONNX.

Route: the dynamo exporter (``torch.onnx.export(..., dynamo=True)``) under
:func:`export_mode.enabled`, as for the CNNs, with the batch and sequence axes of every
input dynamic (``trtqat.transformers.export`` names them). The shape-only kernels of
``trtqat.export._torch_export.register_fake_kernels`` are what lets the fake-quant ops of
the encoder trace with symbolic shapes. The graph then goes through the CNN pipeline's
post-processing (int8 weight initializers, opset conversion, fp16 conversion, metadata).

Validation, per variant, on real tokenized sentences at each ``(batch, sequence)`` of
``shapes`` (two different ones prove both axes are dynamic): onnx.checker, ONNX Runtime
(CPU, graph optimisations off) against PyTorch, and the TensorRT Q/DQ lint for INT8.
Embedding fidelity replaces top-1 agreement: the *mean* cosine of ORT's embeddings with
PyTorch's must reach :data:`MIN_MEAN_COSINE`, and every sentence's cosine the floor
:data:`MIN_COSINE` (so one broken row, e.g. a padded one, cannot hide behind the mean).
fp32: 0.999 both (same arithmetic; measured 1 - 1e-7), fp16: 0.99 both. int8: mean 0.999,
floor 0.98. Quantizers default to the full range [-128, 127], which is what ONNX
QuantizeLinear and TensorRT's Q compute, so the Q/DQ file and the PyTorch fake-quant model
agree up to float rounding. Measured on all-MiniLM-L6-v2 PTQ at 2x16, 3x9, 2x128 and 3x7:
int8 mean 0.99999 (mse), 0.99983 (percentile 99.99), 0.99967 (max), 0.99959 (entropy),
lowest sentence 0.9967; with the old narrow-range default, mse at 2x128 and 3x9 gave mean
0.996, min 0.991. The floor sits below the mean because a quantized encoder is
discontinuous: a last-bit difference in a matmul flips a code and some sentences amplify it
(mse at 8x32: mean 0.9965, min 0.9906). int8-fp16: mean 0.965, floor 0.94, because fp16
arithmetic before each QuantizeLinear flips many codes (measured mean 0.974 to 0.996 over
the four calibrators, lowest sentence 0.956; the same with either range).
The tiny test BERT gives 1 - 1e-6.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from trtqat.export import validate as val
from trtqat.export._torch_export import name_nodes, torch_to_onnx
from trtqat.export.errors import ExportError
from trtqat.export.fp16 import FP16_MAX
from trtqat.export.lint import lint_model
from trtqat.export.naming import FP16_VARIANTS, INT8_VARIANTS
from trtqat.export.onnx_export import (
    ExportResult,
    _check_args,
    _finish,
    _target_opset,
    check_writable,
    prepare,
    write_checked,
)
from trtqat.transformers.checkpoint import TASK
from trtqat.transformers.export import (
    OUTPUT_NAMES,
    encoder_dynamic_shapes,
    example_inputs_for_encoder,
)

log = logging.getLogger(__name__)

MIN_MEAN_COSINE = {"fp32": 0.999, "fp16": 0.99, "int8": 0.999, "int8-fp16": 0.965}
MIN_COSINE = {"fp32": 0.999, "fp16": 0.99, "int8": 0.98, "int8-fp16": 0.94}  # every sentence
FP32_MAX_ABS = 1e-4  # fp32 embeddings (unit vectors when normalized) also match elementwise
DEFAULT_SHAPES = ((2, 16), (3, 9))


def _max_positions(model: nn.Module) -> int | None:
    config = getattr(getattr(model, "backbone", model), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def _check_shapes(shapes: Sequence[tuple[int, int]], limit: int | None) -> list[tuple[int, int]]:
    out = [(int(b), int(n)) for b, n in shapes]
    if not out:
        raise ExportError("shapes is empty: give at least one (batch, sequence) to validate at")
    for b, n in out:
        if b < 1 or n < 2:
            raise ExportError(f"validation shape ({b}, {n}) needs batch >= 1 and sequence >= 2")
        if limit is not None and n > limit:
            raise ExportError(f"sequence length {n} exceeds the encoder's "
                              f"{limit} positions: use --seq-len <= {limit}")
    return out


def encoder_to_onnx(model: nn.Module, inputs: dict[str, torch.Tensor],
                    max_sequence: int | None = None) -> onnx.ModelProto:
    """The dynamo export of ``model`` at :data:`EXPORT_OPSET`, batch and sequence dynamic."""
    names = list(inputs)
    shapes = encoder_dynamic_shapes(names, max_sequence=max_sequence)
    proto = torch_to_onnx(model, tuple(inputs.values()), False, names, OUTPUT_NAMES,
                          dynamic_shapes=tuple(shapes[n] for n in names))
    name_nodes(proto.graph)
    return proto


def _clip_to_fp16_range(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose float constants beyond fp16's range are clipped to it.

    The additive attention mask fills padding with float32's lowest value; in fp16 that is
    -65504, still far below any score, so the softmax is unchanged. Clipping here keeps
    the fp16 converter from warning about it on every export.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    tensors = list(out.graph.initializer) + [
        a.t for n in out.graph.node if n.op_type == "Constant" for a in n.attribute
        if a.name == "value"]
    for t in tensors:
        if t.data_type != onnx.TensorProto.FLOAT:
            continue
        arr = numpy_helper.to_array(t)
        if arr.size and np.abs(arr).max() > FP16_MAX:
            t.CopyFrom(numpy_helper.from_array(np.clip(arr, -FP16_MAX, FP16_MAX), t.name))
    return out


def _cosines(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    num = (got * ref).sum(-1)
    den = np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1)
    return num / np.maximum(den, np.finfo(np.float32).tiny)


def fidelity_check(variant: str, name: str, pairs: Sequence[tuple[np.ndarray, np.ndarray]],
                   shapes: Sequence[tuple[int, int]]) -> val.Check:
    """One line: max abs diff and the mean/min cosine of ORT vs PyTorch embeddings (the mean
    must reach :data:`MIN_MEAN_COSINE`, every sentence :data:`MIN_COSINE`)."""
    title = f"output '{name}' vs PyTorch" + (" fake-quant" if variant in INT8_VARIANTS else "")
    for (got, ref), shape in zip(pairs, shapes):
        if got.shape != ref.shape:
            return val.Check(title, False, f"shape {got.shape} from ONNX Runtime, {ref.shape} "
                             f"from PyTorch at (batch, sequence) {shape}")
    cos = np.concatenate([_cosines(g.astype(np.float64), r.astype(np.float64))
                          for g, r in pairs])
    max_abs = max(float(np.abs(g - r).max(initial=0.0)) for g, r in pairs)
    tol, mean_tol = MIN_COSINE[variant], MIN_MEAN_COSINE[variant]
    ok = (bool(np.isfinite(cos).all()) and float(cos.min()) >= tol
          and float(cos.mean()) >= mean_tol)
    detail = (f"cosine mean {cos.mean():.6f} (>= {mean_tol}), min {cos.min():.6f} (>= {tol}), "
              f"max abs diff {max_abs:.3g}")
    if variant == "fp32":
        ok = ok and max_abs <= FP32_MAX_ABS
        detail += f" (<= {FP32_MAX_ABS:.0e})"
    shown = ", ".join(f"{b}x{n}" for b, n in shapes)
    return val.Check(title, ok, f"{detail}; {len(cos)} sentences at batch x sequence {shown}")


class EncoderExporter:
    """Exports one encoder to several variants, sharing the (slow) exporter runs.

    One float graph serves fp32 and fp16, one Q/DQ graph serves int8 and int8-fp16.
    ``seq_len`` is the traced example's sequence length (the file stays dynamic).
    """

    def __init__(self, model: nn.Module, tokenizer, *, sentences: Sequence[str] | None = None,
                 shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
                 seq_len: int | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.sentences = list(sentences or [])
        self.max_positions = _max_positions(model)
        self.shapes = _check_shapes(shapes, self.max_positions)
        trace_len = seq_len or max(self.shapes[0][1], 2)
        _check_shapes([(2, trace_len)], self.max_positions)
        # torch.export specialises size-1 dimensions: trace with two rows
        self.inputs = example_inputs_for_encoder(tokenizer, 2, trace_len, self.sentences)
        self._graphs: dict[bool, tuple[onnx.ModelProto, nn.Module]] = {}
        self._refs: dict[bool, list[np.ndarray]] = {}

    def _graph(self, int8: bool) -> tuple[onnx.ModelProto, nn.Module]:
        if int8 not in self._graphs:
            reference = prepare(self.model, int8)
            proto = encoder_to_onnx(reference, self.inputs, self.max_positions)
            self._graphs[int8] = (proto, reference)
        return self._graphs[int8]

    def _feeds(self) -> list[dict[str, torch.Tensor]]:
        return [example_inputs_for_encoder(self.tokenizer, b, n, self.sentences)
                for b, n in self.shapes]

    @torch.no_grad()
    def _reference(self, int8: bool, reference: nn.Module) -> list[np.ndarray]:
        if int8 not in self._refs:
            self._refs[int8] = [reference(**feed).float().cpu().numpy()
                                for feed in self._feeds()]
        return self._refs[int8]

    def export(self, path: str | os.PathLike, variant: str = "int8", opset: int = 17, *,
               validate: bool = True, metadata: dict[str, str] | None = None) -> ExportResult:
        """Write one variant to ``path`` (checked first; see :func:`export_encoder`)."""
        _check_args(variant, opset)
        path = Path(path)
        check_writable(path.parent)
        int8 = variant in INT8_VARIANTS
        opset = _target_opset(variant, opset)
        base, reference = self._graph(int8)
        if variant in FP16_VARIANTS:
            base = _clip_to_fp16_range(base)
        model = _finish(base, variant, opset, "float32")
        props = {"trtqat.task": TASK,
                 "trtqat.inputs": ",".join(self.inputs),
                 "trtqat.outputs": ",".join(OUTPUT_NAMES), **(metadata or {})}
        for key, value in props.items():
            model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=str(value)))
        result = ExportResult(path, variant, opset, True)
        check = (lambda tmp: self._validate(tmp, variant, reference, result)) if validate else None
        return write_checked(model, result, check)

    def _validate(self, tmp: str, variant: str, reference: nn.Module,
                  result: ExportResult) -> None:
        session = val.ort_session(tmp)
        refs = self._reference(variant in INT8_VARIANTS, reference)
        names = [i.name for i in session.get_inputs()]
        pairs = []
        for feed, ref in zip(self._feeds(), refs):
            got = val.run_ort(session, [feed[n] for n in names])[0]
            pairs.append((got, ref))
        result.checks.append(fidelity_check(variant, session.get_outputs()[0].name, pairs,
                                            self.shapes))
        if variant in INT8_VARIANTS:
            result.lint = lint_model(tmp)


def export_encoder(model: nn.Module, tokenizer, path: str | os.PathLike, variant: str = "int8",
                   *, opset: int = 17, sentences: Sequence[str] | None = None,
                   validate: bool = True, shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
                   metadata: dict[str, str] | None = None) -> ExportResult:
    """Export a :class:`SentenceEncoder` as one ONNX ``variant`` (fp32, fp16, int8, int8-fp16).

    Inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the tokenizer makes
    them), batch and sequence dynamic; output ``sentence_embedding``, batch dynamic. INT8
    variants need active calibrated quantizers (``quantize_transformer`` then calibration or
    QAT); float variants export with the quantizers disabled. Unless ``validate`` is False,
    ONNX Runtime is compared with PyTorch on ``sentences`` (or built-in ones) tokenized at
    each ``(batch, sequence)`` of ``shapes``, and INT8 files are linted; a failed check
    raises :class:`ValidationError` and keeps no file. ``metadata`` is added to the file's
    metadata (next to ``trtqat.variant``, ``trtqat.task``, ...). Returns the ExportResult.
    """
    exporter = EncoderExporter(model, tokenizer, sentences=sentences, shapes=shapes)
    return exporter.export(path, variant, opset, validate=validate, metadata=metadata)


__all__ = ["DEFAULT_SHAPES", "MIN_COSINE", "MIN_MEAN_COSINE", "EncoderExporter", "encoder_to_onnx",
           "export_encoder", "fidelity_check"]

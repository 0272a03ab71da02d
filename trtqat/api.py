"""The Python API: the verbs of the command line on in-memory models.

``trtqat.quantize`` -> your own training loop (:func:`trtqat.qat_recipe`) ->
:func:`export_onnx` -> :func:`trtqat.build_engine` -> :func:`trtqat.benchmark`. Each verb
runs the code its command runs (``trtqat calibrate``, ``trtqat qat``, ``trtqat export``,
``trtqat build``, ``trtqat-exec``), for every model family (CNNs, Vision Transformers,
sentence encoders): the family of a model is found once (:func:`trtqat.families.of_module`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from trtqat.export.result import ExportResult


def export_onnx(model: nn.Module, example_inputs: Any, path: str | os.PathLike[str],
                variant: str = "int8", *, opset: int | None = None, dynamic_batch: bool = True,
                dynamic_axes: Sequence[str] | None = None,
                validation_data: Iterable | None = None, validate: bool = True,
                io_dtype: str = "fp32", fold_bn: bool = True,
                metadata: dict[str, str] | None = None,
                fp8_weights: str = "compressed") -> ExportResult:
    """Export ``model`` to one checked ONNX ``variant`` at ``path``, as ``trtqat export`` does.

    ``variant``: ``fp32``, ``fp16``, ``int8`` (Q/DQ; needs calibrated quantizers: see
    ``trtqat.quantize``), ``int8-fp16``, or ``fp8``/``fp8-fp16`` (FP8 E4M3 Q/DQ of a model
    quantized with ``{"format": "fp8"}``; ``fp8_weights``: ``compressed``, FP8 weight
    initializers read by DequantizeLinear, or ``qdq``, float weights with Q/DQ).
    ``example_inputs``: what ``model`` takes: an image batch (or a tuple of tensors), or a
    dict by ``forward`` argument name, such as a tokenizer's output for a sentence encoder
    (whose batch and sequence axes are always dynamic); an ``ExportPlan`` is taken as it
    is. The file goes through the exporter of ``trtqat export`` with the plan of the
    model's family: BatchNorm folded (``fold_bn``), the batch dynamic unless
    ``dynamic_batch=False`` (or the image ``dynamic_axes`` of ``batch``, ``height``,
    ``width``), ``opset`` (None: 17, raised to the variant's minimum; an explicit opset
    below 19 is refused for fp8 variants, raised for int8-fp16), the family's metadata and
    engine hints plus ``metadata``, ``io_dtype`` (fp16 variants: ``fp32`` adds casts).

    Before the file is written, atomically: onnx.checker, ONNX Runtime against PyTorch on the
    example and on ``validation_data`` (batches, ``(inputs, labels)`` pairs or dicts) with
    the family's check (top-1 agreement for classifiers, cosine for embeddings) and, for
    INT8 and FP8, the TensorRT Q/DQ lint. An existing ``path`` is replaced only when it is an ONNX
    model trtqat exported (else :class:`~trtqat.out_paths.OutputPathError`). A failed check
    raises :class:`~trtqat.export.ValidationError` (its ``result`` holds every check) and keeps
    no file; bad input raises :class:`~trtqat.export.ExportError`.

    Returns the :class:`~trtqat.export.ExportResult`: ``path``, ``variant``, ``opset``,
    ``checks``, ``lint`` (INT8), ``passed``, ``lines()`` (as ``trtqat export`` prints them).

    Example usage::

        result = trtqat.export_onnx(model, images[:2], "model-int8.onnx", variant="int8")
        print("\\n".join(result.lines()))
    """
    from trtqat import families
    from trtqat.checks import check_module
    from trtqat.export.onnx_export import ExportPlan
    from trtqat.export.onnx_export import export_onnx as export_file
    from trtqat.export.result import refuse_foreign_onnx
    from trtqat.variants import canonical

    check_module(model, "export_onnx")
    refuse_foreign_onnx(path)  # before any work: trtqat replaces only its own exports
    family = families.of_module(model)
    plan = example_inputs if isinstance(example_inputs, ExportPlan) else family.module_plan(
        model, example_inputs, dynamic_batch=dynamic_batch, dynamic_axes=dynamic_axes,
        validation_data=validation_data, fold_bn=fold_bn)
    return export_file(model, family.stamp_plan(plan), path, canonical(variant), opset,
                       io_dtype=io_dtype, validate=validate, metadata=metadata,
                       fp8_weights=fp8_weights)


__all__ = ["export_onnx"]

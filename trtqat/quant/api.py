"""``trtqat.quantize``: the quantizers ``trtqat calibrate`` places, and calibration, in one call.

    import trtqat
    model = trtqat.quantize(model, {"method": "entropy"}, forward_loop=calib_loader)
    trtqat.export_onnx(model, example, "model-int8.onnx")

``forward_loop`` is ModelOpt's idiom (a callable that runs the model over calibration data)
or any iterable of batches (tensors, ``(inputs, labels)`` pairs, dicts of keyword inputs).
A model built under ``quant_modules.initialize()`` (pytorch-quantization's flow) keeps its
Quant* layers and their quantizers; ``quantize`` adds what the placement needs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from trtqat.checks import check_module
from trtqat.errors import CalibrationError, QuantConfigError
from trtqat.quant.config import QuantConfig
from trtqat.quant.format_apply import apply_format, check_format_layers
from trtqat.quant.model_ops import (
    calibrating,
    collect_stats,
    compute_amax,
    disable_layers,
    leave_out_unused,
    name_quantizers,
    quantizers,
    skipped,
)
from trtqat.quant.modules import FLOAT_TO_QUANT
from trtqat.quant.placement import Placement, place
from trtqat.quant.placement.verify import verify_placement
from trtqat.quant.plugins.ultralytics import TASK_FLOAT, head_float_layers, head_task

log = logging.getLogger(__name__)

ForwardLoop = Callable[[nn.Module], Any] | Iterable[Any]


def quantize(model: nn.Module, config: QuantConfig | Mapping[str, Any] | None = None, *,
             forward_loop: ForwardLoop | None = None,
             example_inputs: Any = None) -> nn.Module:
    """Quantize ``model`` in place with TensorRT's Q/DQ placement; calibrate it when
    ``forward_loop`` is given. Returns ``model``. Layers the model marks with a
    ``trtqat_float_layers`` attribute (glob patterns; the detection family's models mark
    their final prediction convs and DFL) stay float, as in ``trtqat calibrate``; an
    Ultralytics ``DetectionModel`` without the attribute keeps its head's the same way.

    Args:
        model: a built float model, or one built under ``quant_modules.initialize()``.
        config: a :class:`QuantConfig` or a dict of its fields (None: the defaults, which
            are what ``trtqat calibrate`` uses).
        forward_loop: calibration data: ``forward_loop(model)`` runs the model (ModelOpt's
            idiom), or an iterable of batches. amax then comes from ``config.method``.
        example_inputs: a tensor or tuple of inputs; each rewritten module is then checked
            to compute what it computed before (a module that does not is restored, with a
            NOTE line).
    """
    check_module(model, "quantize")
    cfg = QuantConfig.of(config)
    if type(model) in FLOAT_TO_QUANT:
        raise QuantConfigError("quantize() takes a model that contains layers, not a single "
                               "layer: use QuantXxx.from_float(layer)")
    placement = place(model, cfg)
    if not any(True for _ in quantizers(model)):
        raise QuantConfigError(nothing_to_quantize(model, cfg))
    apply_format(model, cfg.format, cfg.block_size, cfg.int4_embeddings)
    if example_inputs is not None:
        verify_placement(model, example_inputs, placement)
    marked = getattr(model, "trtqat_float_layers", None)
    if marked is None and (marked := head_float_layers(model)):
        log.warning("NOTE the Ultralytics %s head's prediction convs and DFL stay float%s (as "
                    "Ultralytics' QAT keeps them); set model.trtqat_float_layers = () before "
                    "quantize() to quantize them", type(model.model[-1]).__name__,
                    TASK_FLOAT.get(head_task(model) or "", ""))
    keep_float = (*held(model, tuple(marked or ())), *cfg.keep_float)
    if keep_float:
        disable_layers(model, keep_float)
    check_format_layers(model, cfg.format)  # after skip_layers and keep_float
    if forward_loop is not None:
        calibrate(model, forward_loop, cfg.method or default_method(placement),
                  percentile=cfg.percentile, num_batches=cfg.num_batches)
    return model


def nothing_to_quantize(model: nn.Module, cfg: QuantConfig) -> str:
    """Why ``quantize`` found no layer to quantize in ``model``, and what to do."""
    name = type(model).__name__
    if cfg.skip_layers:
        return (f"quantize() left nothing to quantize in {name}: skip_layers "
                f"{list(cfg.skip_layers)} match every layer it could quantize")
    transformers = sys.modules.get("transformers")  # a model of it means it is imported
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        return (f"quantize() found no layer to quantize in {name}: decoder Hugging Face models "
                "(GPT-2, Llama, ...) are not supported; trtqat quantizes encoders (BERT, "
                "RoBERTa, ViT, ...) and image models")
    return (f"quantize() found no layer to quantize in {name}: it quantizes Conv, "
            "ConvTranspose, Linear, matmul and attention layers (TensorRT's INT8 layers), "
            "and the model has none that it can see")


def held(model: nn.Module, patterns: Sequence[str]) -> tuple[str, ...]:
    """The ``patterns`` that match a module holding quantizers."""
    names = [name for name, m in model.named_modules()
             if name and any(True for _ in quantizers(m))]
    return tuple(p for p in patterns if any(skipped(name, (p,)) for name in names))


def quantize_(model: nn.Module, config: QuantConfig | Mapping[str, Any] | None = None,
              **kwargs: Any) -> None:
    """torchao's spelling: :func:`quantize` in place, returning None."""
    quantize(model, config, **kwargs)


# The CNN family's calibrator: the best PTQ top-1 measured (benchmarks/calib_default.py,
# ResNet18 and MobileNetV2 on digits, 3 seeds each; the README has the table), as
# pytorch-quantization's and ModelOpt's INT8 flows start. Entropy (TensorRT's legacy
# calibrator, the default until issue 33) lost 10-14 points there: it clips ReLU outputs.
# FP8 keeps it: `calib_default.py --formats int8,fp8` (4 FP32 epochs, seeds 0-2, both
# models): fp8 max 95.00, fp8 mse 95.05 (a tie: on E4M3's grid mse rarely clips), fp8
# percentile 99.99 94.44 mean top-1 (int8 max 95.32, FP32 95.37).
CNN_METHOD = "max"


def default_method(placement: Placement) -> str:
    """The amax method the CLI's families use: mse with attention (ViTs, encoders; entropy
    clips softmax probabilities), :data:`CNN_METHOD` otherwise (CNNs)."""
    return "mse" if placement.attention else CNN_METHOD


def calibrate(model: nn.Module, forward_loop: ForwardLoop, method: str = "max", *,
              percentile: float = 99.99, num_batches: int | None = None) -> list[str]:
    """Collect statistics with ``forward_loop`` and set every amax with ``method``.

    Returns the quantizers left out because they never ran (see ``leave_out_unused``).
    """
    left_out: list[str] = []
    if callable(forward_loop) and not hasattr(forward_loop, "__iter__"):
        name_quantizers(model)
        if not any(True for _ in quantizers(model)):
            raise CalibrationError("the model has no quantizer: nothing to calibrate")
        with calibrating(model), torch.no_grad():
            forward_loop(model)
        left_out = leave_out_unused(model)
    elif isinstance(forward_loop, (torch.Tensor, Mapping)) or not hasattr(forward_loop,
                                                                          "__iter__"):
        raise CalibrationError(f"forward_loop must be a callable taking the model or an "
                               f"iterable of batches, got {type(forward_loop).__name__}")
    else:
        collect_stats(model, forward_loop, num_batches, progress=False, left_out=left_out)
    options = {"percentile": percentile} if method == "percentile" else {}
    compute_amax(model, method, **options)
    return left_out

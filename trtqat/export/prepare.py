"""Model preparation for export: quantizers checked and clipped as deployed, or disabled."""

from __future__ import annotations

import copy

import torch
from torch import nn

from trtqat.export.calibrated import refuse_uncalibrated
from trtqat.export.errors import ExportError
from trtqat.quant.blockwise import fold_block_weights
from trtqat.quant.model_ops import quantizers
from trtqat.quant.reparam import training_form
from trtqat.quant.tensor_quantizer import TensorQuantizer


def refuse_training_form(model: nn.Module) -> None:
    """Refuse INT8 export of a quantized model whose re-parameterizable blocks (RepVGG,
    MobileOne) are still in their training form: the engine would run their BatchNorm and
    branch Add in float."""
    pending = training_form(model)
    if pending:
        raise ExportError(
            f"{len(pending)} module(s) are still in their re-parameterizable training form "
            f"(e.g. {pending[0]}), so INT8 would leave their BatchNorm and branch Add in "
            "float: re-parameterize the float model before quantizing (trtqat.quantize does "
            "unless QuantConfig(reparameterize=False); or "
            "timm.utils.reparameterize_model(model, inplace=True)), then calibrate again")


def check_quantizers(model: nn.Module) -> int:
    """Refuse INT8 export of a model whose quantizers are missing or uncalibrated, or that
    is in a re-parameterizable training form.

    Returns the number of active quantizers.
    """
    refuse_uncalibrated(model)
    refuse_training_form(model)
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
        if bool((amax < 0).any()):  # before the zero check: name the value, not "amax 0"
            raise ExportError(f"quantizer '{name}' has amax {float(amax.min()):g}, which is "
                              f"negative (a range is >= 0): {hint}")
        if bool((amax <= 0).all()):
            raise ExportError(f"quantizer '{name}' has amax 0, so it represents nothing: "
                              f"{hint}")
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
        fold_block_weights(ref)  # INT4 weights: their fake-quantized values (int4 variants)
    else:
        for m in ref.modules():
            if isinstance(m, TensorQuantizer):
                m.disable()
    return ref


def skipped_layers(model: nn.Module) -> tuple[str, ...]:
    """Layers left in float on purpose: ``model.trtqat_skip_layers`` (the ``--skip-layers``
    patterns) if set, else the owners of the disabled quantizers of a quantized model."""
    explicit = getattr(model, "trtqat_skip_layers", None)
    if explicit is not None:
        return tuple(explicit)
    names = [n for n, q in quantizers(model)
             if q.disabled and not getattr(q, "_format_off", False)]  # int4's activations
    if len(names) == sum(1 for _, q in quantizers(model)
                         if not getattr(q, "_format_off", False)):
        return ()  # nothing quantized (a float model): nothing left out on purpose
    owners = [n.rsplit(".", 1)[0] if n.endswith(("._input_quantizer", "._weight_quantizer"))
              else n for n in names]
    return tuple(dict.fromkeys(owners))

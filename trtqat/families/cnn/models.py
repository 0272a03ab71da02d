"""Classification models by name (torchvision), float or quantized, and the CNN family's
quantization: TensorRT's Q/DQ placement (:func:`trtqat.quant.placement.place`) with
histogram-calibrated activations.

Checkpoints written before the graph placement (no ``placement`` in their spec) are
rebuilt with the placement they were calibrated with (``LEGACY``): layer quantizers and a
quantizer on the identity input of torchvision's BasicBlock/Bottleneck.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import torchvision
from torch import nn

from trtqat.errors import TrtqatError
from trtqat.quant import quant_modules
from trtqat.quant.config import QuantConfig
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.model_ops import disable_layers
from trtqat.quant.placement import PLACEMENT_VERSION, Placement, place
from trtqat.quant.placement.place import GRAPH_1, GRAPH_2

# Activations are calibrated with histograms: max, percentile, MSE and entropy all come from
# one collection pass.
QUANT_DESC_INPUT = QuantDescriptor(num_bits=8, calib_method="histogram")
LEGACY = "legacy"


class UnknownModelError(TrtqatError, ValueError):
    """The model name is not a torchvision classification model."""


def classification_models() -> list[str]:
    """Names of torchvision's classification models."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def _check_name(name: str) -> None:
    names = classification_models()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
        hint = (f"did you mean {', '.join(close)}?" if close
                else "see torchvision.models.list_models()")
        raise UnknownModelError(f"unknown model {name!r}: {hint}")


def _torchvision_block(module: nn.Module) -> bool:
    from torchvision.models.resnet import BasicBlock, Bottleneck

    return getattr(type(module), "_trtqat_base", type(module)) in (BasicBlock, Bottleneck)


def quantize_classifier(model: nn.Module, skip_layers: Sequence[str] = (),
                        placement: str | None = None,
                        quant_desc_input: QuantDescriptor = QUANT_DESC_INPUT) -> Placement:
    """Quantize ``model`` in place with ``placement`` (:data:`PLACEMENT_VERSION`, or
    :data:`LEGACY` for old checkpoints); ``skip_layers`` globs are disabled afterwards
    (float on purpose, the quantizers kept so checkpoints stay loadable)."""
    if placement == LEGACY:
        cfg = QuantConfig(quant_desc_input=quant_desc_input, concat=False, pool=False,
                          attention=False)
        result = place(model, cfg, modules=_torchvision_block, exact_types=True)
    elif placement in (None, PLACEMENT_VERSION):
        result = place(model, QuantConfig(quant_desc_input=quant_desc_input))
    elif placement == GRAPH_2:  # no residual quantizer seen through untraced modules
        result = place(model, QuantConfig(quant_desc_input=quant_desc_input,
                                          untraced_exits=False))
    elif placement == GRAPH_1:  # own-forward subclasses float, re-parameterizable kept
        result = place(model, QuantConfig(quant_desc_input=quant_desc_input,
                                          own_forward=False, reparameterize=False,
                                          untraced_exits=False))
    else:
        raise TrtqatError(f"the checkpoint was quantized with placement {placement!r}, which "
                          f"this trtqat does not know ({PLACEMENT_VERSION}, {GRAPH_2}, "
                          f"{GRAPH_1}, {LEGACY}): upgrade trtqat")
    if skip_layers:
        disable_layers(model, tuple(skip_layers))
    return result


def add_residual_quantizers(model: nn.Module,
                            quant_desc: QuantDescriptor = QUANT_DESC_INPUT) -> int:
    """The legacy placement: quantizers on the identity input of torchvision's residual
    blocks (and the layers); returns how many residual quantizers were added."""
    result = quantize_classifier(model, (), LEGACY, quant_desc)
    return sum(1 for _, rule in result.added if rule == "residual-add")


def build_model(name: str, num_classes: int, quantized: bool = False,
                quant_desc_input: QuantDescriptor = QUANT_DESC_INPUT) -> nn.Module:
    """A randomly initialised torchvision classification model, float or fake-quantized
    (built under ``quant_modules.initialize()``, then placed like the CLI does)."""
    _check_name(name)
    if num_classes < 2:
        raise TrtqatError(f"--num-classes must be >= 2, got {num_classes}")
    if not quantized:
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    from trtqat.quant.modules import FLOAT_TO_QUANT

    classes = tuple(FLOAT_TO_QUANT.values())
    # each class's own setting (most inherit theirs from QuantMixin / QuantInputMixin, and
    # must again afterwards, so that a user's QuantMixin.set_default_... reaches them)
    saved = [c.__dict__.get("default_quant_desc_input") for c in classes]
    for c in classes:
        c.default_quant_desc_input = quant_desc_input
    try:
        with quant_modules.initialized():
            model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    finally:
        for c, d in zip(classes, saved):
            if d is None:
                del c.default_quant_desc_input
            else:
                c.default_quant_desc_input = d
    quantize_classifier(model, (), PLACEMENT_VERSION, quant_desc_input)
    return model

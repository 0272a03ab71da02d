"""Quantized Conv/Linear subclasses that have a forward of their own.

timm's ``StdConv2d`` / ``ScaledStdConv2d`` (and a user's own subclass) compute an
*effective* weight (the weight standardised, scaled by a gain) and call ``F.conv2d`` with
it, so the Quant* layer's forward, which quantizes ``self.weight``, cannot replace theirs.
Their quantized class keeps the subclass's forward and intercepts, while it runs, its
first call of the base layer's function (``conv2d`` for a ``Conv2d``, ``linear`` for a
``Linear``...): the input quantizer sees that call's input and the weight quantizer the
effective weight it passes. Nothing is known about the weight transform, so any subclass
works.

For export, :func:`fold_effective_weights` computes each effective weight once on real
data and keeps it as a constant, so the ONNX graph holds ``Conv(DQ(Q(x)), DQ(Q(W_eff)))``
and no float standardisation ops in front of the weight's DequantizeLinear.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from trtqat.quant.modules import FLOAT_TO_QUANT, _QuantWeighted

# the base layer -> the functions its forward computes with
LAYER_FUNCTIONS: dict[type, tuple[Callable, ...]] = {
    nn.Conv1d: (torch.conv1d,), nn.Conv2d: (torch.conv2d,), nn.Conv3d: (torch.conv3d,),
    nn.ConvTranspose1d: (torch.conv_transpose1d,),
    nn.ConvTranspose2d: (torch.conv_transpose2d,),
    nn.ConvTranspose3d: (torch.conv_transpose3d,),
    nn.Linear: (F.linear,),
}


def float_layer(module: nn.Module) -> type | None:
    """The torch.nn weighted layer ``module`` subclasses with a forward of its own, or None
    (its own class is torch.nn's, it keeps the base forward, it is already quantized, or it
    holds weighted layers whose calls could be taken for its own: a LoRA-style adapter)."""
    cls = type(module)
    if cls in FLOAT_TO_QUANT or isinstance(module, _QuantWeighted) or "forward" in vars(module):
        return None
    if any(isinstance(m, tuple(LAYER_FUNCTIONS)) for m in module.modules() if m is not module):
        return None
    for base in LAYER_FUNCTIONS:
        if isinstance(module, base) and cls.forward is not base.forward:
            return base
    return None


class _Intercept(TorchFunctionMode):
    """Sends the first call of ``layer``'s function through its quantizers."""

    def __init__(self, layer: QuantOwnForward) -> None:
        super().__init__()
        self._layer = layer
        self._functions = LAYER_FUNCTIONS[layer._trtqat_float_layer]
        self.hit = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if self.hit or func not in self._functions:
            return func(*args, **kwargs)
        self.hit = True
        args = list(args)
        x = args[0] if args else kwargs.pop("input")
        w = args[1] if len(args) > 1 else kwargs.pop("weight")
        layer = self._layer
        store = layer.__dict__.get("_trtqat_store")
        if store is not None:  # fold_effective_weights: the first call's effective weight
            store.setdefault(id(layer), w.detach().clone())
        folded = layer._buffers.get("_trtqat_folded_weight")
        x, w = layer._input_quantizer(x), layer._weight_quantizer(w if folded is None else folded)
        return func(x, w, *args[2:], **kwargs)


class QuantOwnForward(_QuantWeighted):
    """A Conv/Linear subclass's own forward with quantized input and effective weight (the
    one it passes to the layer's function)."""

    _trtqat_float_layer: type = nn.Conv2d  # the torch.nn layer
    _trtqat_float_class: type = nn.Conv2d  # the subclass it quantizes

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with _Intercept(self):
            return super().forward(*args, **kwargs)

    @classmethod
    def from_float(cls, module: nn.Module, quant_desc_input=None, quant_desc_weight=None):
        """``module`` itself, its class made this quantized one and its quantizers added
        (in place: a subclass may hold state a copy would not know of)."""
        subclass = own_forward_class(type(module))
        quant = FLOAT_TO_QUANT[subclass._trtqat_float_layer]
        module.__class__ = subclass
        module.init_quantizer(quant_desc_input or quant.default_quant_desc_input,
                              quant_desc_weight or quant.default_quant_desc_weight)
        return module

    def __reduce_ex__(self, protocol):
        return (_rebuild, (type(self)._trtqat_float_class,), self.__dict__.copy())


_CLASSES: dict[type, type] = {}


def own_forward_class(cls: type) -> type:
    """The quantized class of the float subclass ``cls`` (cached; ``cls`` itself when it
    is one already)."""
    if issubclass(cls, QuantOwnForward):
        return cls
    if cls not in _CLASSES:
        base = next(b for b in LAYER_FUNCTIONS if issubclass(cls, b))
        new = type(f"Quant{cls.__name__}", (QuantOwnForward, cls), {
            "_trtqat_float_layer": base, "_trtqat_float_class": cls, "__module__": __name__,
            "__doc__": f"{cls.__name__} with quantized input and effective weight."})
        new.__qualname__ = new.__name__
        _CLASSES[cls] = new
    return _CLASSES[cls]


def _rebuild(cls: type) -> nn.Module:
    new = own_forward_class(cls)
    return new.__new__(new)


def own_forward_layers(model: nn.Module) -> list[tuple[str, QuantOwnForward]]:
    """Every quantized own-forward layer of ``model`` with its name."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QuantOwnForward)]


@torch.no_grad()
def fold_effective_weights(model: nn.Module, run: Callable[[nn.Module], Any]) -> list[str]:
    """Compute each own-forward layer's effective weight once (``run(model)`` runs the model
    on real inputs) and keep it as the constant its forward quantizes from then on (in
    place: for the copy about to be exported). Returns the names of the layers folded; a
    layer that did not run keeps computing its weight."""
    layers = own_forward_layers(model)
    if not layers:
        return []
    store: dict[int, torch.Tensor] = {}
    for _, layer in layers:
        layer._trtqat_store = store
    try:
        run(model)
    finally:
        for _, layer in layers:
            del layer._trtqat_store
    folded = []
    for name, layer in layers:
        w = store.get(id(layer))
        if w is not None:
            layer.register_buffer("_trtqat_folded_weight", w, persistent=False)
            folded.append(name)
    return folded

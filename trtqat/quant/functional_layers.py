"""Quantized paths for layers whose weights a model uses through ``torch.nn.functional``.

torchvision's Swin attention calls ``F.linear(x, self.qkv.weight, ...)`` and
``F.linear(x, self.proj.weight, ...)`` inside ``shifted_window_attention``, so the
QuantLinear modules ``qkv`` and ``proj`` never run: their quantizers see no data ("calibrator
collected no data") and the exported attention has no Q/DQ. Here each Swin attention's
forward routes those two functional calls through the layers' own quantizers, so Swin
calibrates, trains and exports with INT8 attention projections like any other Linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

_LINEAR = F.linear


class _RoutedFunctional:
    """``torch.nn.functional`` with ``linear`` on given weights sent through quantizers."""

    def __init__(self, routes: list[tuple[torch.Tensor, nn.Module]]) -> None:
        self._routes = routes

    def __getattr__(self, name: str):
        return getattr(F, name)

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        for w, layer in self._routes:
            if weight is w:  # the bias may be a modified copy (Swin V2), so keep the given one
                return _LINEAR(layer._input_quantizer(x), layer._weight_quantizer(weight), bias)
        return _LINEAR(x, weight, bias)


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}


class _RoutedMatmuls(TorchFunctionMode):
    """Sends the matrix products of one call through ``targets``, in order (Swin's
    ``Q @ K^T`` then ``P @ V``); later products and every other op run as they are."""

    def __init__(self, targets: list[nn.Module]) -> None:
        super().__init__()
        self._targets = list(targets)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MATMULS and self._targets and len(args) == 2 and not kwargs:
            return self._targets.pop(0)(args[0], args[1])
        return func(*args, **kwargs)


class _RoutedAttention:
    """Forward of a torchvision Swin attention with ``qkv`` and ``proj`` quantized (and,
    given ``matmul_qk``/``matmul_av``, both attention products)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.models import swin_transformer as swin

        routes = [(self.qkv.weight, self.qkv), (self.proj.weight, self.proj)]
        products = [getattr(self, n, None) for n in ("matmul_qk", "matmul_av")]
        saved = swin.F
        swin.F = _RoutedFunctional(routes)  # read at call time by shifted_window_attention
        try:
            if all(p is not None for p in products):
                with _RoutedMatmuls(products):
                    return super().forward(x)
            return super().forward(x)
        finally:
            swin.F = saved


def _attention_classes() -> dict[type, type]:
    from torchvision.models.swin_transformer import ShiftedWindowAttention, ShiftedWindowAttentionV2

    return {ShiftedWindowAttention: QuantShiftedWindowAttention,
            ShiftedWindowAttentionV2: QuantShiftedWindowAttentionV2}


def quantize_functional_layers(model: nn.Module) -> int:
    """Give every Swin attention of ``model`` whose ``qkv``/``proj`` are quantized a forward
    that uses their quantizers (in place); returns how many were changed."""
    classes = _attention_classes()
    count = 0
    for module in model.modules():
        new = classes.get(type(module))
        if new is not None and hasattr(module.qkv, "_input_quantizer") \
                and hasattr(module.proj, "_input_quantizer"):
            module.__class__ = new
            count += 1
    return count


def quantize_window_attention(model: nn.Module, quant_desc_input=None) -> list[nn.Module]:
    """Give every quantized Swin attention of ``model`` a ``matmul_qk`` and ``matmul_av``
    (``QuantMatMul``) for its two attention products; returns the modules changed."""
    from trtqat.quant.plugins.matmul import QuantMatMul

    changed = []
    for module in model.modules():
        if isinstance(module, _RoutedAttention) and not hasattr(module, "matmul_qk"):
            module.matmul_qk = QuantMatMul(quant_desc_input)
            module.matmul_av = QuantMatMul(quant_desc_input)
            changed.append(module)
    return changed


def _make(base_name: str) -> type:
    from torchvision.models import swin_transformer as swin

    base = getattr(swin, base_name)
    return type(f"Quant{base_name}", (_RoutedAttention, base),
                {"__doc__": f"{base_name} with quantized qkv and proj projections.",
                 "__module__": __name__})


QuantShiftedWindowAttention = _make("ShiftedWindowAttention")
QuantShiftedWindowAttentionV2 = _make("ShiftedWindowAttentionV2")

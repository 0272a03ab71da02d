"""The models that ``qat_overhead.py`` times beside trtqat's: same weights, same calibration data.

* :func:`native_model`: the calibrated trtqat model with every ``TensorQuantizer`` replaced by
  torch's own ``fake_quantize_per_tensor_affine`` / ``fake_quantize_per_channel_affine`` ops
  (same ranges, same bits): what hand-wiring the built-in ops costs;
* :func:`pytorch_quantization_model`: NVIDIA pytorch-quantization (its CUDA kernel), max calibration;
* :func:`modelopt_model`: NVIDIA Model Optimizer ``mtq.quantize(model, INT8_DEFAULT_CFG, ...)``.

Each returns ``(model, label)`` or ``(None, why it was not measured)``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import warnings
from collections.abc import Callable

import torch
from torch import nn

from trtqat.quant.tensor_quantizer import TensorQuantizer

Factory = Callable[[], nn.Module]


def _imported(*names: str) -> tuple[list | None, str]:
    """The modules (quietly imported), or None and why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [importlib.import_module(n) for n in names], ""
    except Exception as exc:  # not installed, or no support for this platform
        return None, f"{names[0]} not importable ({type(exc).__name__}: {exc})"


class NativeFakeQuant(nn.Module):
    """torch's built-in fake-quant op with a trtqat quantizer's range (symmetric, zero point 0)."""

    def __init__(self, quantizer: TensorQuantizer) -> None:
        super().__init__()
        amax = quantizer.amax.float()
        self.qmin, self.qmax = quantizer.minbound, quantizer.maxbound
        scale = (amax / self.qmax).clamp_min(torch.finfo(torch.float32).tiny)
        self.axis = None
        if amax.numel() > 1:
            self.axis = next(d for d, size in enumerate(amax.shape) if size > 1)
            scale = scale.reshape(-1)
            self.register_buffer("zero_point", torch.zeros(scale.numel(), dtype=torch.int32))
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.axis is None:
            return torch.fake_quantize_per_tensor_affine(x, self.scale, torch.zeros(
                (), dtype=torch.int32, device=x.device), self.qmin, self.qmax)
        return torch.fake_quantize_per_channel_affine(x, self.scale, self.zero_point, self.axis,
                                                      self.qmin, self.qmax)


def native_model(quantized: nn.Module) -> tuple[nn.Module | None, str]:
    """A copy of the calibrated trtqat model whose quantizers are torch's fake-quant ops."""
    import copy

    model = copy.deepcopy(quantized)
    swaps = [(name, m) for name, m in model.named_modules() if isinstance(m, TensorQuantizer)
             and not m.disabled and m.amax is not None]
    for name, quantizer in swaps:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, NativeFakeQuant(quantizer))
    return model, f"torch fake_quantize_* ({len(swaps)} ops)"


def pytorch_quantization_model(factory: Factory, state: dict, calib: list,
                               device: torch.device) -> tuple[nn.Module | None, str]:
    """pytorch-quantization's Quant* modules, max-calibrated, or why not."""
    modules, why = _imported("pytorch_quantization", "pytorch_quantization.nn",
                             "pytorch_quantization.quant_modules")
    if modules is None:
        return None, why
    pytorch_quantization, pq_nn, pq_modules = modules
    try:
        pq_modules.initialize()
        try:
            model = factory()
        finally:
            pq_modules.deactivate()
        model.load_state_dict(state, strict=False)
        model.to(device)
        quantizers = [m for m in model.modules() if isinstance(m, pq_nn.TensorQuantizer)]
        for q in quantizers:
            q.disable_quant()
            q.enable_calib()
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            for x, _ in calib:
                model(x.to(device))
            for q in quantizers:
                q.load_calib_amax()
                q.disable_calib()
                q.enable_quant()
    except Exception as exc:
        return None, f"pytorch-quantization failed ({type(exc).__name__}: {exc})"
    return model, f"pytorch-quantization {getattr(pytorch_quantization, '__version__', '?')}"


def modelopt_model(factory: Factory, state: dict, calib: list,
                   device: torch.device) -> tuple[nn.Module | None, str]:
    """NVIDIA Model Optimizer INT8 (default config), or why not."""
    modules, why = _imported("modelopt", "modelopt.torch.quantization")
    if modules is None:
        return None, why
    modelopt, mtq = modules
    model = factory()
    model.load_state_dict(state)
    model.to(device)

    def forward_loop(m: nn.Module) -> None:
        for x, _ in calib:
            m(x.to(device))

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)
    except Exception as exc:
        return None, f"mtq.quantize failed on {device.type} ({type(exc).__name__}: {exc})"
    return model, f"modelopt {getattr(modelopt, '__version__', '?')}"

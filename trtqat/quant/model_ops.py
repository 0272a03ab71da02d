"""Model-wide operations: quantize a built model, calibrate it, switch its quantizers."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn
from tqdm.auto import tqdm

from trtqat.errors import CalibrationError, QuantConfigError
from trtqat.quant.calib.registry import get_method, methods
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.modules import FLOAT_TO_QUANT
from trtqat.quant.tensor_quantizer import TensorQuantizer
from trtqat.runopts import progress_bars

log = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)



def __getattr__(name: str):
    # AMAX_METHODS: the registered amax methods (trtqat.quant.calib.registry), at access time
    if name == "AMAX_METHODS":
        return methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class QuantConfig:
    """How :func:`quantize` turns float layers into Quant* layers.

    Args:
        quant_desc_input: descriptor of every input quantizer (default: each class's default).
        quant_desc_weight: descriptor of every weight quantizer (default: per channel).
        float_module_list: torch.nn class names to leave in float, e.g. ``("Linear",)``.
        skip_layers: glob patterns of module names to leave in float, e.g. ``("fc", "layer1.*")``.
    """

    quant_desc_input: QuantDescriptor | None = None
    quant_desc_weight: QuantDescriptor | None = None
    float_module_list: tuple[str, ...] = field(default_factory=tuple)
    skip_layers: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("quant_desc_input", "quant_desc_weight"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, QuantDescriptor):
                raise QuantConfigError(f"QuantConfig.{name} must be a QuantDescriptor, got {type(value).__name__}")
        known = {cls.__name__ for cls in FLOAT_TO_QUANT}
        object.__setattr__(self, "float_module_list", tuple(self.float_module_list))
        object.__setattr__(self, "skip_layers", tuple(self.skip_layers))
        unknown = set(self.float_module_list) - known
        if unknown:
            raise QuantConfigError(f"float_module_list names {sorted(unknown)}; choose from {sorted(known)}")


def skipped(name: str, patterns: Iterable[str]) -> bool:
    """True if module ``name`` matches one of the glob ``patterns``."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def quantize(model: nn.Module, config: QuantConfig | None = None) -> nn.Module:
    """Replace, in place, the float layers of an already built ``model`` by Quant* layers.

    Layers keep their parameters (shared, not copied). Returns ``model``.
    """
    config = config or QuantConfig()
    float_names = set(config.float_module_list)

    def visit(parent: nn.Module, prefix: str) -> None:
        for child_name, child in list(parent.named_children()):
            full = f"{prefix}{child_name}"
            cls = FLOAT_TO_QUANT.get(type(child))
            if cls is not None and type(child).__name__ not in float_names and not skipped(full, config.skip_layers):
                setattr(parent, child_name, cls.from_float(child, config.quant_desc_input, config.quant_desc_weight))
            else:
                visit(child, full + ".")

    if type(model) in FLOAT_TO_QUANT:
        raise QuantConfigError("quantize() takes a model that contains layers, not a single layer: use QuantXxx.from_float(layer)")
    visit(model, "")
    from trtqat.quant.functional_layers import quantize_functional_layers

    quantize_functional_layers(model)  # Swin attention: F.linear on QuantLinear weights
    name_quantizers(model)
    return model


def modules_of(model: nn.Module, cls: type[M]) -> Iterator[tuple[str, M]]:
    """Every submodule of ``model`` that is a ``cls``, with its qualified name."""
    for name, module in model.named_modules():
        if isinstance(module, cls):
            yield name, module


def quantizers(model: nn.Module) -> Iterator[tuple[str, TensorQuantizer]]:
    """Every TensorQuantizer of ``model`` with its qualified name."""
    return modules_of(model, TensorQuantizer)


def name_quantizers(model: nn.Module) -> None:
    """Let every quantizer know its name, so its errors can say which one it is."""
    for name, q in quantizers(model):
        q._name = name


def disable_layers(model: nn.Module, patterns: Iterable[str]) -> list[str]:
    """Disable the quantizers of modules whose name matches a glob pattern; returns them.

    Those layers keep their float path (no fake quant, no Q/DQ in an exported ONNX).
    """
    patterns = tuple(patterns)
    hit = []
    for name, module in model.named_modules():
        if name and skipped(name, patterns):
            for _, q in quantizers(module):
                q.disable()
            if any(True for _ in quantizers(module)):
                hit.append(name)
    if patterns and not hit:
        raise QuantConfigError(f"--skip-layers {','.join(patterns)} matches no quantized layer; list layer names with `trtqat sensitivity`")
    return hit


def _set_calibration(model: nn.Module, on: bool) -> None:
    for _, q in quantizers(model):
        if q._calibrator is None:
            q.disable() if on else q.enable()
        elif on:
            q.disable_quant()
            q.enable_calib()
        else:
            q.enable_quant()
            q.disable_calib()


def enable_calibration(model: nn.Module) -> None:
    """Quantizers collect statistics and pass tensors through unquantized."""
    _set_calibration(model, True)


def disable_calibration(model: nn.Module) -> None:
    """Quantizers stop collecting and quantize again."""
    _set_calibration(model, False)


def enable_quantization(model: nn.Module) -> None:
    """Every quantizer fake-quantizes."""
    for _, q in quantizers(model):
        q.enable_quant()


def disable_quantization(model: nn.Module) -> None:
    """Every quantizer passes tensors through (the model computes in float)."""
    for _, q in quantizers(model):
        q.disable_quant()


def _batch_input(batch):
    """The model input of a batch: the first item of ``(inputs, labels)``, else the batch."""
    return batch[0] if isinstance(batch, (list, tuple)) else batch


@torch.no_grad()
def collect_stats(model: nn.Module, data_loader: Iterable, num_batches: int | None = None,
                  device: torch.device | str | None = None, progress: bool = True) -> int:
    """Run up to ``num_batches`` batches through ``model`` with calibration enabled.

    Returns the number of batches seen. Under torch.distributed, statistics are merged
    across ranks afterwards so that every rank computes the same amax.
    """
    if num_batches is not None and num_batches < 1:
        raise CalibrationError(f"num_batches must be >= 1, got {num_batches}")
    name_quantizers(model)
    if not any(True for _ in quantizers(model)):
        raise CalibrationError("the model has no TensorQuantizer: build it under quant_modules.initialize() or call trtqat.quantize(model) first")
    was_training = model.training
    model.eval()
    enable_calibration(model)
    seen = 0
    try:
        total = num_batches
        if total is None:
            try:
                total = len(data_loader)  # type: ignore[arg-type]
            except TypeError:
                total = None
        for batch in tqdm(data_loader, total=total, desc="calibrate", disable=not progress_bars(progress), leave=False):
            x = _batch_input(batch)
            if device is not None:
                x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
            model(**x) if isinstance(x, dict) else model(x)
            seen += 1
            if num_batches is not None and seen >= num_batches:
                break
    finally:
        disable_calibration(model)
        model.train(was_training)
    if seen == 0:
        raise CalibrationError("calibration got no data: the data loader is empty; give it at least one batch")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from trtqat.quant.calib.distributed import sync_calibrators

        sync_calibrators([q._calibrator for _, q in quantizers(model) if q._calibrator is not None])
    return seen


def compute_amax(model: nn.Module, method: str = "max", **kwargs) -> None:
    """Set every quantizer's amax from its calibrator.

    ``method`` (a registered amax method: 'max', 'percentile', 'mse', 'entropy', ...; see
    :mod:`trtqat.quant.calib.registry`) applies to calibrators that take one (histograms),
    with e.g. ``percentile=99.99``; max calibrators always use the maximum.
    """
    get_method(method)  # an unknown method is refused before any quantizer changes
    name_quantizers(model)
    for _, q in quantizers(model):
        if q._calibrator is None or q.disabled:
            continue
        if q._calibrator.takes_method:
            q.load_calib_amax(method, **kwargs)
        else:
            q.load_calib_amax()

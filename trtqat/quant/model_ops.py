"""Model-wide operations: quantize a built model, calibrate it, switch its quantizers."""

from __future__ import annotations

import fnmatch
import itertools
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import nn

from trtqat.errors import CalibrationError, QuantConfigError
from trtqat.progress import progress as progress_of
from trtqat.quant.calib.registry import get_method, methods
from trtqat.quant.config import QuantConfig
from trtqat.quant.mixin import QUANT_LAYERS
from trtqat.quant.modules import FLOAT_TO_QUANT, _float_base
from trtqat.quant.own_forward import float_layer, own_forward_class
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)


def __getattr__(name: str):
    # AMAX_METHODS: the registered amax methods (trtqat.quant.calib.registry), at access time
    if name == "AMAX_METHODS":
        return methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def skipped(name: str, patterns: Iterable[str]) -> bool:
    """True if module ``name`` matches one of the glob ``patterns``."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def quantize(model: nn.Module, config: QuantConfig | None = None, *,
             exact_types: bool = False, own_forward: bool = True) -> nn.Module:
    """Replace, in place, the float layers of an already built ``model`` by Quant* layers.

    Layers keep their parameters (shared, not copied); subclasses that keep their base
    class's forward are replaced too, unless ``exact_types`` (the rule of checkpoints
    written before placement was recorded), and so are Conv/Linear subclasses with a
    forward of their own (weight standardisation: quantized through the weight they
    compute, :mod:`trtqat.quant.own_forward`) unless ``own_forward`` is False (the rule of
    checkpoints of placement ``graph-1``). Returns ``model``.
    """
    config = config or QuantConfig()
    float_names = set(config.float_module_list)
    kept: list[str] = []  # own-forward subclasses left float (own_forward=False)

    def visit(parent: nn.Module, prefix: str) -> None:
        for child_name, child in list(parent.named_children()):
            full = f"{prefix}{child_name}"
            cls = FLOAT_TO_QUANT.get(type(child)) if exact_types else quant_class(child,
                                                                                   own_forward)
            if cls is None and not exact_types and type(child) not in FLOAT_TO_QUANT and any(
                    isinstance(child, base) for base in FLOAT_TO_QUANT) and \
                    not isinstance(child, QUANT_LAYERS):
                kept.append(f"{full} ({type(child).__name__})")
            if cls is not None and _float_base(cls).__name__ not in float_names \
                    and not skipped(full, config.skip_layers):
                setattr(parent, child_name, cls.from_float(child, config.quant_desc_input, config.quant_desc_weight))
            elif not isinstance(child, nn.MultiheadAttention):  # its own plugin quantizes it
                visit(child, full + ".")

    if type(model) in FLOAT_TO_QUANT:
        raise QuantConfigError("quantize() takes a model that contains layers, not a single layer: use QuantXxx.from_float(layer)")
    visit(model, "")
    if kept:
        log.warning("NOTE %d layer(s) subclass a quantizable layer with a forward of their own, "
                    "so they stay float: %s", len(kept), ", ".join(kept[:5]))
    from trtqat.quant.functional_layers import quantize_functional_layers

    quantize_functional_layers(model)  # Swin attention: F.linear on QuantLinear weights
    name_quantizers(model)
    return model


# subclasses whose forward computes exactly what their base class computes
_SAME_FORWARD = {"timm.layers.linear.Linear", "torch.nn.modules.linear.NonDynamicallyQuantizableLinear"}


def quant_class(module: nn.Module, own_forward: bool = True) -> type | None:
    """The Quant* class that replaces ``module``: its own class's, its base class's for a
    subclass that keeps the base forward (timm's ``Linear``), with ``own_forward`` the
    quantized class of a Conv/Linear subclass with a forward of its own (timm's
    ``ScaledStdConv2d``); None otherwise."""
    cls = type(module)
    if cls in FLOAT_TO_QUANT:
        return FLOAT_TO_QUANT[cls]
    if isinstance(module, QUANT_LAYERS):
        return None
    for base, quant in FLOAT_TO_QUANT.items():
        if isinstance(module, base) and (cls.forward is base.forward or
                                         f"{cls.__module__}.{cls.__qualname__}" in _SAME_FORWARD):
            return quant
    if own_forward and float_layer(module) is not None:
        return own_forward_class(cls)
    return None


def modules_of(model: nn.Module, cls: type[M]) -> Iterator[tuple[str, M]]:
    """Every submodule of ``model`` that is a ``cls``, with its qualified name."""
    for name, module in model.named_modules():
        if isinstance(module, cls):
            yield name, module


def quantizers(model: nn.Module) -> Iterator[tuple[str, TensorQuantizer]]:
    """Every TensorQuantizer of ``model`` with its qualified name."""
    return modules_of(model, TensorQuantizer)


def quantizer_names(model: nn.Module) -> tuple[dict[int, list[str]], dict[int, TensorQuantizer]]:
    """Every name of every quantizer (one shared by several places has several), and the
    quantizers, both keyed by ``id``."""
    names: dict[int, list[str]] = {}
    objects: dict[int, TensorQuantizer] = {}
    for name, q in model.named_modules(remove_duplicate=False):
        if isinstance(q, TensorQuantizer):
            names.setdefault(id(q), []).append(name)
            objects[id(q)] = q
    return names, objects


def name_quantizers(model: nn.Module) -> None:
    """Let every quantizer know its name, so its errors can say which one it is."""
    for name, q in quantizers(model):
        q._name = name


def disable_layers(model: nn.Module, patterns: Iterable[str]) -> list[str]:
    """Disable the quantizers of modules whose name matches a glob pattern; returns them.

    Those layers keep their float path (no fake quant, no Q/DQ in an exported ONNX). A
    quantizer shared with modules the patterns leave alone (a Concat or MaxPool scale
    group) stays on for them: the matched module gets a disabled copy of its own.
    """
    patterns = tuple(patterns)
    hit = []
    for name, module in model.named_modules():
        if name and skipped(name, patterns) and any(True for _ in quantizers(module)):
            hit.append(name)
    if patterns and not hit:
        raise QuantConfigError(f"--skip-layers {','.join(patterns)} matches no quantized layer; list layer names with `trtqat sensitivity`")
    prefixes = tuple(f"{h}." for h in hit)
    names, objects = quantizer_names(model)
    for key, all_names in names.items():
        inside = [n for n in all_names if n in hit or n.startswith(prefixes)]
        if not inside:
            continue
        if len(inside) == len(all_names):
            objects[key].disable()
            continue
        for name in inside:  # shared with modules left quantized: a disabled copy here
            parent, _, attr = name.rpartition(".")
            copy_ = _copy_module(objects[key])
            copy_.disable()
            setattr(model.get_submodule(parent) if parent else model, attr, copy_)
    return hit


def _copy_module(q: TensorQuantizer) -> TensorQuantizer:
    import copy

    return copy.deepcopy(q)


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
    if isinstance(batch, (list, tuple)):
        first = batch[0]
        return first if isinstance(first, (torch.Tensor, dict, tuple, list)) else batch
    return batch


def call_with(model: nn.Module, inputs):
    """``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple or list, else
    ``model(inputs)``."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _batch_call(model: nn.Module, batch, device) -> None:
    x = _batch_input(batch)
    call_with(model, x if device is None else _to(x, device))


@contextmanager
def calibrating(model: nn.Module) -> Iterator[None]:
    """The model in eval mode with every quantizer collecting statistics; afterwards
    quantizing again and the training mode restored."""
    was_training = model.training
    model.eval()
    enable_calibration(model)
    try:
        yield
    finally:
        disable_calibration(model)
        model.train(was_training)


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


def _collected(q: TensorQuantizer) -> bool:
    c = q._calibrator
    return not (getattr(c, "_calib_amax", 0) is None or getattr(c, "_hist", 0) is None)


def leave_out_unused(model: nn.Module) -> list[str]:
    """Disable the enabled quantizers whose calibrator saw no data (their module never ran:
    an unused head, an auxiliary branch); one NOTE line names them. Returns their names."""
    unused = [n for n, q in quantizers(model)
              if q._calibrator is not None and not q.disabled and q._amax is None
              and not _collected(q)]
    for name in unused:
        model.get_submodule(name).disable()
    if unused:
        shown = ", ".join(unused[:6]) + (f" (+{len(unused) - 6} more)" if len(unused) > 6 else "")
        log.warning("NOTE %d quantizer(s) never ran during calibration, so they are left out "
                    "(float): %s", len(unused), shown)
    return unused


@torch.no_grad()
def collect_stats(model: nn.Module, data_loader: Iterable, num_batches: int | None = None,
                  device: torch.device | str | None = None, progress: bool = True,
                  left_out: list[str] | None = None) -> int:
    """Run up to ``num_batches`` batches through ``model`` with calibration enabled.

    A batch is the model input (a tensor, a tuple of positional inputs, a dict of keyword
    inputs) or ``(inputs, labels)``. Returns the number of batches seen. Under
    torch.distributed, statistics are merged across ranks afterwards so that every rank
    computes the same amax. Quantizers that saw no data are disabled with one NOTE line
    (:func:`leave_out_unused`); their names are appended to ``left_out``.
    """
    if num_batches is not None and num_batches < 1:
        raise CalibrationError(f"num_batches must be >= 1, got {num_batches}")
    name_quantizers(model)
    if not any(True for _ in quantizers(model)):
        raise CalibrationError("the model has no TensorQuantizer: build it under quant_modules.initialize() or call trtqat.quantize(model) first")
    seen = 0
    with calibrating(model):
        try:
            total = len(data_loader)  # type: ignore[arg-type]
        except TypeError:
            total = None
        if num_batches is not None:  # the loop ends by itself: the last batch is counted
            total = num_batches if total is None else min(total, num_batches)
            data_loader = itertools.islice(data_loader, num_batches)
        for batch in progress_of(data_loader, total=total, desc="calibrate", enabled=progress):
            _batch_call(model, batch, device)
            seen += 1
    if seen == 0:
        raise CalibrationError("calibration got no data: the data loader is empty; give it at least one batch")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from trtqat.quant.calib.distributed import sync_calibrators

        sync_calibrators([q._calibrator for _, q in quantizers(model) if q._calibrator is not None])
    unused = leave_out_unused(model)
    if left_out is not None:
        left_out.extend(unused)
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

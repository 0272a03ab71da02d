"""Matrix products and concats of modules FX cannot trace, quantized where they are called.

Placement rewrites a module's graph; a module whose forward cannot be traced (a branch on a
tensor's value or shape, a ``with`` block on the input's device) keeps float products and
unshared Concat scales. For those, :func:`hook_calls` installs forward hooks that activate
a torch function mode while the module's own code runs: each ``torch.matmul`` / ``@`` /
``torch.bmm`` / ``F.linear`` / ``F.scaled_dot_product_attention`` / ``torch.cat`` call it
makes (directly or through a helper method or function, not inside a child module) goes
through a quantized stand-in of its call site:

* ``matmul`` / ``bmm`` / ``@``: a :class:`~trtqat.quant.plugins.matmul.QuantMatMul` (both
  operands per tensor, as TensorRT's INT8 MatMul needs);
* ``F.linear``: :class:`QuantLinearCall` (input per tensor, weight per row);
* ``F.scaled_dot_product_attention``: a :class:`~trtqat.quant.plugins.sdpa.QuantSDPA`;
* ``torch.cat``: :class:`QuantCat`, one quantizer on every input, shared with the quantized
  layers inside the module that read an input or the result (TensorRT wants one scale on a
  Concat's inputs and consumers), found by the tensors those layers are called on.

A call site is the code line that calls (``<function>_l<line in function>_<kind>``, with
``_1``, ``_2``, ... for later calls from the same line in one forward); its stand-in is
created the first time it runs (calibration), in the calling mode of the module's other
quantizers, and from a state_dict's keys when a checkpoint is loaded. The exported ONNX gets
Q/DQ on both inputs of each product.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from trtqat.quant.descriptor import QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW, QuantDescriptor
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.plugins.sdpa import QuantSDPA
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger("trtqat.quant.placement")

ATTR = "_trtqat_calls"
_KINDS: dict[Any, str] = {
    torch.matmul: "matmul", torch.Tensor.matmul: "matmul", torch.Tensor.__matmul__: "matmul",
    torch.bmm: "matmul", torch.Tensor.bmm: "matmul", torch.Tensor.__rmatmul__: "rmatmul",
    F.linear: "linear", F.scaled_dot_product_attention: "sdpa", torch.cat: "cat",
    torch.concat: "cat",
}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS = __file__
_NAME = re.compile(r"[^0-9A-Za-z_]")
_ACTIVE = threading.local()  # .modes: the _Calls modes of the forwards running now


class QuantLinearCall(nn.Module):
    """``F.linear(input, weight, bias)`` with the input per tensor and the weight per row."""

    def __init__(self, quant_desc_input: QuantDescriptor,
                 quant_desc_weight: QuantDescriptor | None = None) -> None:
        super().__init__()
        self._input_quantizer = TensorQuantizer(quant_desc_input)
        self._weight_quantizer = TensorQuantizer(quant_desc_weight
                                                 or QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW)

    def forward(self, input: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(self._input_quantizer(input), self._weight_quantizer(weight), bias)


class QuantCat(nn.Module):
    """``torch.cat(tensors, dim)`` with every input through the quantizer of a quantized
    layer that reads an input or the result (:meth:`share_with`); a Concat no quantized
    layer reads stays float (its own quantizer, disabled, stands in until then)."""

    def __init__(self, quant_desc_input: QuantDescriptor) -> None:
        super().__init__()
        self._input_quantizer = TensorQuantizer(quant_desc_input)
        self._input_quantizer.disable()

    def forward(self, tensors, dim: int = 0) -> torch.Tensor:
        if not getattr(self, "_shared", False):
            if self._input_quantizer._amax is None:
                return torch.cat(list(tensors), dim)
            self._input_quantizer.enable()  # a checkpoint's: it was shared when calibrated
            self._shared = True
        return torch.cat([self._input_quantizer(t) for t in tensors], dim)

    def share_with(self, layer: nn.Module) -> None:
        """``layer`` (it reads an input or the result) and this Concat quantize with one
        quantizer, as TensorRT needs one scale on a Concat's inputs and consumers: the
        first such layer's (so a scale it already shares stays shared), which later ones
        take. A layer kept float, of another format or with another range keeps its own."""
        mine, theirs = self._input_quantizer, getattr(layer, "_input_quantizer", None)
        if not isinstance(theirs, TensorQuantizer) or theirs is mine or theirs._disabled \
                or torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return  # (an export traces what the eager calls before it shared)
        same = (mine._num_bits, mine._unsigned, mine._axis, type(mine._calibrator)) == \
            (theirs._num_bits, theirs._unsigned, theirs._axis, type(theirs._calibrator))
        ranges = (mine._amax is None and theirs._amax is None) or (
            mine._amax is not None and theirs._amax is not None
            and torch.equal(mine._amax.to(theirs._amax.device), theirs._amax))
        if not (same and ranges):
            return
        if getattr(self, "_shared", False):
            layer._input_quantizer = mine
        else:
            self._input_quantizer = theirs
            self._shared = True


class CallSites(nn.Module):
    """The quantized stand-ins of one untraceable module's product call sites (children
    named by site), and the torch function mode that routes its calls through them."""

    def __init__(self, quant_desc_input: QuantDescriptor,
                 quant_desc_weight: QuantDescriptor | None = None) -> None:
        super().__init__()
        self.desc_input = quant_desc_input
        self.desc_weight = quant_desc_weight
        self.sites = nn.ModuleDict()
        self._modes: list[_Calls] = []

    def site(self, name: str, owner: nn.Module) -> nn.Module:
        """The stand-in of call site ``name`` (created on first use, in the calling mode of
        ``owner``'s other quantizers)."""
        found = self.sites[name] if name in self.sites else None
        if found is None:
            found = self._new(name)
            ref = _reference_quantizer(owner, self)
            device = _device_of(owner)
            for q in found.modules():
                if isinstance(q, TensorQuantizer) and ref is not None:
                    q._if_calib, q._if_quant = ref._if_calib, ref._if_quant
            self.sites[name] = found.to(device) if device is not None else found
        return found

    def _new(self, name: str) -> nn.Module:
        kind = name.rsplit("_", 1)[-1] if not name[-1].isdigit() else \
            name.rsplit("_", 2)[-2]
        if kind == "linear":
            return QuantLinearCall(self.desc_input, self.desc_weight)
        if kind == "sdpa":
            return QuantSDPA(self.desc_input)
        if kind == "cat":
            return QuantCat(self.desc_input)
        return QuantMatMul(self.desc_input)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        """A checkpoint's call sites exist before their state is loaded."""
        head = prefix + "sites."
        for key in state_dict:
            if key.startswith(head):
                name = key[len(head):].split(".", 1)[0]
                if name not in self.sites:
                    self.sites[name] = self._new(name)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)


def _reference_quantizer(owner: nn.Module, sites: CallSites) -> TensorQuantizer | None:
    own = {id(m) for m in sites.modules()}
    for m in owner.modules():
        if isinstance(m, TensorQuantizer) and id(m) not in own and \
                m._calibrator is not None and not m._disabled:
            return m
    return None


def _device_of(owner: nn.Module) -> torch.device | None:
    for t in owner.parameters():
        return t.device
    for t in owner.buffers():
        return t.device
    return None


class _Calls(TorchFunctionMode):
    """Active while ``owner``'s forward runs: its own product calls go through its sites."""

    def __init__(self, owner: nn.Module, sites: CallSites) -> None:
        super().__init__()
        self.owner, self.sites = owner, sites
        self.seen: Counter[str] = Counter()
        self.layers = {id(m) for m in owner.modules()}
        self.readers: dict[int, tuple[torch.Tensor, list[nn.Module]]] = {}
        self.cats: dict[int, tuple[torch.Tensor, QuantCat]] = {}
        self.cat_inputs: dict[int, tuple[torch.Tensor, QuantCat]] = {}

    def read(self, layer: nn.Module, x: object) -> None:
        """``layer`` (a quantized layer inside the owner) is called on ``x``."""
        if id(layer) not in self.layers or not isinstance(x, torch.Tensor):
            return
        for found in (self.cats, self.cat_inputs):
            if id(x) in found:
                found[id(x)][1].share_with(layer)
        self.readers.setdefault(id(x), (x, []))[1].append(layer)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _KINDS.get(func)
        if kind is None or not (_float_list(args[:1]) if kind == "cat"
                                else _float_tensors(args[:2])):
            return func(*args, **kwargs)
        where = self._call_site()
        if where is None:
            return func(*args, **kwargs)
        key = _NAME.sub("_", f"{where}_{'matmul' if kind == 'rmatmul' else kind}")
        self.seen[key] += 1
        name = key if self.seen[key] == 1 else f"{key}_{self.seen[key] - 1}"
        site = self.sites.site(name, self.owner)
        if kind == "cat":
            return self._cat(site, *args, **kwargs)
        if kind == "linear" or kind == "sdpa":
            return site(*args, **kwargs)
        a, b = args[:2]
        if kind == "rmatmul":  # b @ a
            return func(site.other_quantizer(a), site.input_quantizer(b))
        return func(site.input_quantizer(a), site.other_quantizer(b), *args[2:], **kwargs)

    def _cat(self, site: QuantCat, tensors, dim: int = 0) -> torch.Tensor:
        for t in tensors:
            for layer in self.readers.get(id(t), (None, []))[1]:
                site.share_with(layer)
            self.cat_inputs[id(t)] = (t, site)
        out = site(tensors, dim)
        self.cats[id(out)] = (out, site)
        return out

    def _call_site(self) -> str | None:
        """``<function>_l<line>`` of the owner's code that made the call, or None when the
        call comes from inside a child module."""
        frame = sys._getframe(2)
        site = None
        for _ in range(64):
            if frame is None:
                return None
            code = frame.f_code
            if site is None and not code.co_filename.startswith(_TORCH_DIR) \
                    and code.co_filename != _THIS:
                site = f"{code.co_name.strip('<>')}_l{frame.f_lineno - code.co_firstlineno}"
            if code.co_argcount and code.co_varnames[0] == "self":
                me = frame.f_locals.get("self")
                if me is self.owner:
                    return site
                if isinstance(me, nn.Module):
                    return None
            frame = frame.f_back
        return None


def _float_tensors(values: tuple) -> bool:
    return len(values) == 2 and all(isinstance(v, torch.Tensor) and v.is_floating_point()
                                    for v in values)


def _float_list(values: tuple) -> bool:
    return len(values) == 1 and isinstance(values[0], (list, tuple)) and len(values[0]) > 1 \
        and all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in values[0])


def _modes() -> list[_Calls]:
    if not hasattr(_ACTIVE, "modes"):
        _ACTIVE.modes = []
    return _ACTIVE.modes


def _compiling() -> bool:
    """Under torch.compile (not torch.export, which runs the Python code)."""
    return torch.compiler.is_compiling() and not torch.compiler.is_exporting()


def _enter(module: nn.Module, args: tuple) -> None:
    if _compiling():
        # torch.compile cannot run the mode (it walks Python frames); the compiled forward
        # computes the module's products unquantized, which export and eager calls quantize
        _warn_compiled(module)
        return
    sites = getattr(module, ATTR)
    mode = _Calls(module, sites)
    mode.__enter__()
    sites._modes.append(mode)
    _modes().append(mode)


def _exit(module: nn.Module, args: tuple, output: Any) -> None:
    sites = getattr(module, ATTR)
    if sites._modes and not _compiling():
        mode = sites._modes.pop()
        mode.__exit__(None, None, None)
        active = _modes()
        if mode in active:
            active.remove(mode)


@torch.compiler.disable
def _warn_compiled(module: nn.Module) -> None:
    if not getattr(module, "_trtqat_compile_noted", False):
        module._trtqat_compile_noted = True
        log.warning("NOTE torch.compile runs %s's own matmul/linear/attention/concat calls "
                    "unquantized (their call-site quantizers need eager mode); eager calls "
                    "and the ONNX export quantize them", type(module).__name__)


def _note_read(layer: nn.Module, args: tuple) -> None:
    """A quantized layer's call: the running owners learn which tensor it reads."""
    if _compiling():
        return
    for mode in _modes():
        mode.read(layer, args[0] if args else None)


def hook_calls(module: nn.Module, quant_desc_input: QuantDescriptor,
               quant_desc_weight: QuantDescriptor | None = None) -> bool:
    """Quantize the product calls of ``module``'s own code (see module doc); False when it
    already is, or cannot be (a TorchScript module)."""
    if isinstance(module, torch.jit.ScriptModule) or isinstance(getattr(module, ATTR, None),
                                                                 CallSites):
        return False
    setattr(module, ATTR, CallSites(quant_desc_input, quant_desc_weight))
    module.register_forward_pre_hook(_enter)
    module.register_forward_hook(_exit, always_call=True)
    for layer in module.modules():
        if isinstance(getattr(layer, "_input_quantizer", None), TensorQuantizer) and \
                _note_read not in layer._forward_pre_hooks.values():
            layer.register_forward_pre_hook(_note_read)
    return True


def call_sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, stand-in)`` of every call site created so far in ``model``."""
    return [(name, m) for name, m in model.named_modules()
            if name.rsplit(".", 2)[-2:-1] == ["sites"] and ATTR in name]

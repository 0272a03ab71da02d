"""What a TensorQuantizer's forward runs, decided once per quantizer state (issue 35).

A QAT step calls every quantizer twice (forward and backward) with the same state, so the
checks and dispatch decisions of the common case - a stored integer range, fake quantization
and no other stage - are taken once and kept in the quantizer's ``_hot`` tuple (:data:`FIELDS`).
The tuple holds the amax it was decided for and that tensor's ``_version`` (-1: none, e.g.
an amax made under ``torch.inference_mode``), and the kernels'
:data:`~trtqat.quant._kernels.EPOCH`: a new or changed amax (assignment, ``load_state_dict``,
``.to()``, an in-place write) or another kernel backend makes the forward decide again. Every
other attribute the decision reads is reset by ``TensorQuantizer.__setattr__``.

What stays per call is what a call can change: the input (its dtype, device, layout and shape,
checked by the compiled kernel, which returns None for inputs it does not take, so that the
general path handles them and raises its errors) and the global export switches.

:func:`quantizer_call` is ``TensorQuantizer.__call__``: when the decision names the compiled
kernel it calls it directly, without ``nn.Module.__call__``'s dispatch (that costs as much as
the kernel on a small tensor); hooks, tracing, compiling or any other state take the usual way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as _module

from trtqat.errors import AmaxValueError
from trtqat.quant import _kernels, export_mode
from trtqat.quant.amax import fits as _fits
from trtqat.quant.functional import onnx_exporting

_fits_plain = _fits.__wrapped__  # what torch.compile traces (dynamo warns about the cache)

is_compiling = torch.compiler.is_compiling
FIELDS = ("amax", "version", "epoch", "kernel", "qmin", "qmax", "unsigned", "plain")
"""The ``_hot`` tuple: the amax decided for, its ``_version``, the kernels' epoch, the compiled
entry point (None: none applies), the integer bounds, unsigned, and whether the plain
fake-quant path applies at all (False: the staged forward)."""


def is_plain(q: Any, amax: torch.Tensor | None) -> bool:
    """Whether quantizer ``q`` (``amax``: its ``_amax`` buffer) is in QAT's common state: a
    stored integer range and fake quantization, no other stage (calibration, clip, a scaled
    or pre-scaled range, learn_amax's Clip) and no subclass overriding a stage."""
    return (amax is not None and q._if_quant and q._fake_quant and q._plain_forward
            and not (q._if_calib or q._if_clip) and q._scale_amax is None
            and q._buffers.get("_pre_quant_scale") is None and "clip" not in q._modules
            and type(q._num_bits) is int)


def decide(quantizer: Any, amax: torch.Tensor | None,
           bounds: Callable[[int, bool, bool], tuple[int, int]]) -> tuple:
    """The ``_hot`` tuple for ``quantizer`` as it is now (``amax``: its ``_amax`` buffer).

    ``bounds(num_bits, unsigned, narrow_range)`` gives the integer range (traced by
    torch.compile: give an uncached function, dynamo warns about a cache wrapper). Raises
    :class:`AmaxValueError` when the stored amax became NaN or infinite after it was checked
    (an in-place write): a non-finite range fails here as it fails on assignment.
    """
    q = quantizer
    plain = is_plain(q, amax)
    kernel, qmin, qmax = None, 0, 0
    compiling = is_compiling()  # traced by torch.compile: no data-dependent check, no kernel
    if plain:
        # on the CPU only: on a GPU the read would stall the stream at every re-decision
        # (and cannot be captured in a CUDA graph); a learned amax gone non-finite there
        # makes the loss non-finite, which the training loop refuses
        if (not compiling and amax.device.type == "cpu"
                and not bool(torch.isfinite(amax).all())):
            raise AmaxValueError(
                f"{q._label()}: amax contains NaN or inf (it was changed in place after it "
                "was set); set a finite amax or recalibrate")
        qmin, qmax = bounds(q._num_bits, q._unsigned, q._narrow_range)
        plain = qmax >= 1
        if plain and not compiling and amax.device.type == "cpu":
            kernel = _kernels.hot_kernel()
    # -1: nothing to compare (no amax, traced, or an inference tensor: it has no version)
    version = -1 if amax is None or compiling or amax.is_inference() else amax._version
    return (amax, version, _kernels.EPOCH, kernel, qmin, qmax, bool(q._unsigned), plain)


def fits(amax_shape: torch.Size, input_shape: torch.Size) -> bool:
    """:func:`trtqat.quant.amax.fits`; traced by torch.compile, its uncached function (dynamo
    warns about, and traces through, the cache wrapper)."""
    return (_fits_plain if is_compiling() else _fits)(amax_shape, input_shape)


# torch's module-wide hooks (dicts changed in place, never rebound): any of them set, every
# call takes nn.Module.__call__, which runs them
_GFP, _GF, _GBP, _GB = (getattr(_module, name, {}) for name in (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
    "_global_backward_hooks"))


_MODULE_CALL = torch.nn.Module.__call__  # torch.fx patches it while it traces
_tracing = torch._C._get_tracing_state


def quantizer_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``TensorQuantizer.__call__``: what ``nn.Module.__call__`` would do, without its dispatch
    cost when it would do nothing but call ``forward`` (no hook, no ``torch.jit.trace``, no
    ``Module.compile()``, nobody patching it as ``torch.fx`` does). Then the compiled kernel
    straight away when the quantizer's decision names it, its amax is unchanged, nothing is
    exporting and ``forward`` is TensorQuantizer's own (not wrapped on the instance, as
    accelerate's hooks do, nor overridden by a subclass or patched on the class): the result
    is what ``forward`` returns. Else ``forward``."""
    if is_compiling():  # dynamo traces this call: nothing read, module dispatch as usual
        return torch.nn.Module.__call__(self, *args, **kwargs)
    d = self.__dict__
    if (d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_pre_hooks"]
            or d["_backward_hooks"] or _GFP or _GF or _GBP or _GB or kwargs or len(args) != 1
            or d.get("_compiled_call_impl") is not None):
        return torch.nn.Module.__call__(self, *args, **kwargs)
    hot = d.get("_hot")
    if (hot is not None and hot[3] is not None and "forward" not in d  # no wrapped forward,
            and (cls := type(self)).forward is cls._own_forward):  # nor a subclass's, a patch
        amax = d["_buffers"].get("_amax")
        if (hot[0] is amax and hot[2] == _kernels.EPOCH
                and (hot[1] < 0 or amax._version == hot[1]) and not d["_disabled"]
                and not export_mode.entered and not type(self).use_fb_fake_quant
                and not onnx_exporting()):
            outputs = hot[3](args[0], amax, hot[4], hot[5], hot[6])
            if outputs is not None:
                return outputs
    if _tracing() or torch.nn.Module.__call__ is not _MODULE_CALL:
        return torch.nn.Module.__call__(self, *args, **kwargs)
    return self.forward(args[0])

"""Speed options shared by every training verb: ``--amp``, ``--channels-last``, ``--compile``.

One :class:`Accel` per run, built by :meth:`Accel.setup` from the run's options and device
(every bad combination is refused there, in one line), serves the CNN recipes
(``trtqat.stages``) and the encoder recipes (``trtqat.families.encoder``) alike:

* ``autocast()``: the forward (and loss) under ``torch.autocast`` in bf16 or fp16;
  parameters, optimizer state and checkpoints stay float32;
* ``backward_step()``: backward and optimizer step, through a gradient scaler for fp16;
* ``prepare()`` / ``inputs()``: channels_last weights and image batches (a no-op for
  tensors that are not 4-D, e.g. token ids);
* ``compiled()``: ``torch.compile`` of a module or a function. The compiled wrapper shares
  the parameters of the plain module; checkpoints are written from the plain module, and
  :func:`plain_state_dict` strips any ``_orig_mod.`` prefix that reaches it anyway.

Calibration statistics are always collected eagerly: ``calibrate --compile`` compiles the
evaluation forward only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trtqat.runopts import AMP_CHOICES, AccelError, AccelOptions  # noqa: F401 - re-exported
from trtqat.runopts import check_amp as check_amp_choice

log = logging.getLogger(__name__)

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILED_PREFIX = "_orig_mod"  # what torch.compile's OptimizedModule puts before every key
COMPILE_BACKEND = "inductor"  # tests use "eager" to trace with dynamo without codegen
OPTION_NAMES = ("amp", "channels_last", "compile", "cuda_graphs")
check_options = check_amp_choice  # refuse an unknown --amp value (device-independent)


def check_amp(amp: str | None, device: torch.device) -> None:
    """Refuse a precision the device cannot run: fp16 on a CPU, bf16 on an old GPU."""
    if amp == "fp16" and device.type != "cuda":
        raise AccelError("--amp fp16 needs a CUDA GPU (float16 autocast with a gradient "
                         "scaler); on the CPU use --amp bf16, or pass --device cuda")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise AccelError(f"--amp bf16: {torch.cuda.get_device_name(device)} has no bfloat16 "
                         "support; use --amp fp16")


def _cpp_compiler() -> str | None:
    """The C++ compiler inductor would call for CPU code, if it is on the PATH."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        name = get_cpp_compiler()
    except Exception:  # noqa: BLE001 - any failure means: no usable compiler
        return None
    return shutil.which(name) if name else None


def check_compile(device: torch.device) -> None:
    """Refuse ``--compile`` where torch.compile cannot work, with the reason and the fix.

    Checks dynamo's support of this Python, the code generator of the device (a C++
    compiler on the CPU, Triton on a GPU), then compiles and runs a one-line function.
    """
    import torch._dynamo

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not torch._dynamo.is_dynamo_supported():
        raise AccelError(f"--compile: torch.compile does not support Python {python} with "
                         f"torch {torch.__version__}; drop --compile (or use a supported "
                         "Python)")
    if COMPILE_BACKEND == "inductor":
        if device.type == "cuda":
            from torch.utils._triton import has_triton

            if not has_triton():
                raise AccelError("--compile on a GPU needs Triton (shipped with the CUDA "
                                 "torch wheels): reinstall torch with CUDA, or drop --compile")
        elif _cpp_compiler() is None:
            raise AccelError("--compile on the CPU needs a C++ compiler (g++ or clang++ on "
                             "the PATH, or CXX=...): install one, or drop --compile")
    try:
        probe = torch.compile(lambda t: t * 2 + 1, backend=COMPILE_BACKEND)
        probe(torch.ones(4, device=device))
    except Exception as exc:  # noqa: BLE001 - the compiler's own failure, reported in a line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise AccelError(f"--compile: torch.compile does not work here ({type(exc).__name__}: "
                         f"{first}); drop --compile") from None


def check_cuda_graphs(opts: Any, device: torch.device, *, graphs: bool = True) -> None:
    """Refuse ``--cuda-graphs`` where the training step cannot be one CUDA graph: no CUDA
    device, a recipe without graph support (``graphs=False``), fp16's gradient scaler,
    ``--compile``, several processes. The model's own checks (quantizers still collecting
    statistics) are the family's."""
    if not getattr(opts, "cuda_graphs", False):
        return
    if not graphs:
        raise AccelError("--cuda-graphs applies to `trtqat train` and `trtqat qat` of image "
                         "classifiers; drop it here")
    if device.type != "cuda":
        raise AccelError(f"--cuda-graphs needs a CUDA GPU (the run is on {device.type}); drop "
                         "it, or pass --device cuda")
    if getattr(opts, "amp", None) == "fp16":
        raise AccelError("--cuda-graphs cannot run fp16's gradient scaler (it checks every "
                         "step on the host): use --amp bf16, or drop one of them")
    if getattr(opts, "compile", False):
        raise AccelError("--cuda-graphs and --compile exclude each other: pick one")
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise AccelError("--cuda-graphs runs in one process: drop it, or run without "
                         "torchrun")


class Accel:
    """The speed options of one run, bound to its device (see the module doc)."""

    def __init__(self, device: torch.device | str = "cpu", amp: str | None = None,
                 channels_last: bool = False, compile: bool = False,
                 cuda_graphs: bool = False) -> None:
        self.device = torch.device(device)
        self.amp = amp
        self.channels_last = channels_last
        self.compile = compile
        self.cuda_graphs = cuda_graphs
        self.scaler = (torch.amp.GradScaler(self.device.type) if amp == "fp16" else None)

    @classmethod
    def setup(cls, opts: Any, device: torch.device, *, images: bool = True,
              graphs: bool = False) -> Accel:
        """Check ``opts`` (an :class:`AccelOptions`) against ``device``; raises AccelError.

        ``images=False`` (encoders) makes ``--channels-last`` a logged no-op; ``graphs``:
        the recipe supports ``--cuda-graphs`` (:func:`check_cuda_graphs`).
        """
        check_amp_choice(opts)
        amp = getattr(opts, "amp", None)
        channels_last = bool(getattr(opts, "channels_last", False))
        compile_ = bool(getattr(opts, "compile", False))
        check_cuda_graphs(opts, device, graphs=graphs)
        check_amp(amp, device)
        if compile_:
            check_compile(device)
        if channels_last and not images:
            log.info("--channels-last has no effect on an encoder (no 4-D activations)")
            channels_last = False
        return cls(device, amp, channels_last, compile_,
                   bool(getattr(opts, "cuda_graphs", False)))

    def options(self) -> dict[str, Any]:
        """The options as recorded in args.yaml."""
        return {"amp": self.amp, "channels_last": self.channels_last, "compile": self.compile,
                "cuda_graphs": self.cuda_graphs}

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` in the --amp precision, or a no-op context."""
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=_AMP_DTYPES[self.amp])

    def prepare(self, model: nn.Module) -> nn.Module:
        """``model`` (in place) with channels_last weights when asked; returns it."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        return model

    def inputs(self, x: Any) -> Any:
        """An image batch in channels_last when asked (other tensors as they are)."""
        if self.channels_last and isinstance(x, torch.Tensor) and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def compiled(self, fn: Callable) -> Callable:
        """``torch.compile(fn)`` with --compile, else ``fn`` itself (a module or function)."""
        if not self.compile:
            return fn
        try:
            return torch.compile(fn, backend=COMPILE_BACKEND)
        except RuntimeError as exc:
            raise AccelError(f"--compile: {str(exc).splitlines()[0][:200]}; drop --compile"
                             ) from None

    def backward_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                      clip: tuple[Iterable[torch.Tensor], float] | None = None) -> None:
        """Backward and optimizer step (scaled for fp16); ``clip=(params, max_norm)``. An
        update that overflows float (an absurd learning rate) is a
        :class:`~trtqat.runs.health.NonFiniteLossError`, stopped like a NaN loss."""
        try:
            self._backward_step(loss, optimizer, clip)
        except RuntimeError as exc:
            if "overflow" not in str(exc):
                raise
            from trtqat.runs.health import NonFiniteLossError

            lr = optimizer.param_groups[0].get("lr")
            raise NonFiniteLossError(f"the weight update overflowed (learning rate {lr:g}): "
                                     f"{str(exc).splitlines()[0]}") from None

    def _backward_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                       clip: tuple[Iterable[torch.Tensor], float] | None) -> None:
        if self.scaler is None:
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(clip[0], clip[1])
            optimizer.step()
            return
        self.scaler.scale(loss).backward()
        if clip is not None:
            self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(clip[0], clip[1])
        self.scaler.step(optimizer)  # skipped when a gradient overflowed
        self.scaler.update()

    def checkpoint_state(self) -> dict[str, Any]:
        """``{"grad_scaler": state}`` for a resumable checkpoint (empty without fp16)."""
        return {} if self.scaler is None else {"grad_scaler": self.scaler.state_dict()}

    def load_checkpoint_state(self, ckpt: dict[str, Any]) -> None:
        """Restore what :meth:`checkpoint_state` saved (if both sides use a scaler)."""
        if self.scaler is not None and ckpt.get("grad_scaler"):
            self.scaler.load_state_dict(ckpt["grad_scaler"])


def plain_module(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel and torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def strip_compiled_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every ``_orig_mod.`` key segment (torch.compile's wrapper) removed."""
    if not any(COMPILED_PREFIX in k for k in state):
        return state
    return {".".join(p for p in k.split(".") if p != COMPILED_PREFIX): v
            for k, v in state.items()}


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the plain module: no wrapper prefixes, contiguous float tensors."""
    state = strip_compiled_prefix(plain_module(model).state_dict())
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state.items()}

"""The options every run shares, in one base dataclass: :class:`RunOptions`.

``TrainConfig``, ``CalibrateConfig`` and ``QATConfig`` (``trtqat.stages``) inherit it, for
image classifiers and sentence encoders alike; its ``__post_init__`` holds the checks they
share. The speed options (``--amp``, ``--channels-last``, ``--compile``,
``--cuda-graphs``) are the :class:`AccelOptions` part; :class:`trtqat.runs.accel.Accel`
applies them.

This module imports nothing of trtqat but its errors (and no torch), so every package, and
the command-line parser, may use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from trtqat.errors import TrtqatError

AMP_CHOICES = ("bf16", "fp16")
OPTIMIZERS = ("sgd", "adamw")
# Defaults of `trtqat train` (fields of the shared option bases whose None means "default");
# here, free of torch, so that the command-line parser can show them.
FP32_DEFAULTS: dict[str, Any] = {
    "model": "resnet18", "data": "digits", "image_size": 32, "batch_size": 32, "epochs": 15,
    "lr": 0.05, "min_lr": 0.0, "momentum": 0.9, "weight_decay": 5e-4, "opt": "sgd",
    "label_smoothing": 0.0}


_TRUSTED = {"model_files": False}


@contextlib.contextmanager
def trusting_model_files(on: bool = True) -> Iterator[None]:
    """``--trust-model-file``: within this block a checkpoint may import the model file it
    records even where the file changed since the checkpoint was written."""
    before = _TRUSTED["model_files"]
    _TRUSTED["model_files"] = bool(on) or before
    try:
        yield
    finally:
        _TRUSTED["model_files"] = before


def model_files_trusted() -> bool:
    """Whether :func:`trusting_model_files` is in force."""
    return _TRUSTED["model_files"]


class ConfigError(TrtqatError, ValueError):
    """An invalid recipe option."""


class AccelError(TrtqatError, RuntimeError):
    """A speed option cannot be used here (--amp fp16 on a CPU, no compiler, ...)."""


def flag(name: str) -> str:
    """The command-line spelling of a config field: ``min_lr`` -> ``--min-lr``."""
    return "--" + name.replace("_", "-")


# the largest learning rate a config takes: above it every run diverges (and float32
# weight updates overflow near 1e38), so it is refused before a run folder is made
MAX_LR = 10.0


def check_positive(cfg: Any, *names: str, allow_none: bool = False, zero: bool = False) -> None:
    """Raise :class:`ConfigError` unless each field is > 0 (>= 0 with ``zero``)."""
    for name in names:
        value = getattr(cfg, name, None)
        if value is None and allow_none:
            continue
        if value is None or not math.isfinite(value) or (value < 0 if zero else value <= 0):
            raise ConfigError(f"{flag(name)} must be a finite number {'>= 0' if zero else '> 0'}, "
                              f"got {value}")


def check_amp(cfg: Any) -> None:
    """Refuse an unknown ``--amp`` value (device-independent; the device checks are
    :meth:`trtqat.runs.accel.Accel.setup`'s)."""
    amp = getattr(cfg, "amp", None)
    if amp is not None and amp not in AMP_CHOICES:
        raise AccelError(f"unknown --amp {amp!r}: use {' or '.join(AMP_CHOICES)} "
                         "(or leave it out for float32)")


@dataclasses.dataclass
class AccelOptions:
    """``--amp bf16|fp16``, ``--channels-last``, ``--compile`` and ``--cuda-graphs``.

    ``amp=None`` runs float32; ``channels_last`` stores conv weights and image batches
    NHWC; ``compile`` runs the model through ``torch.compile`` (inductor); ``cuda_graphs``
    replays the whole training step as one CUDA graph (``trtqat.runs.graphed_step``).
    """

    amp: str | None = None
    channels_last: bool = False
    compile: bool = False
    cuda_graphs: bool = False


@dataclasses.dataclass
class RunOptions(AccelOptions):
    """What every run takes: where it writes, where it runs, how it reports.

    Each field is the command-line option of the same name (``limit_batches`` is
    ``--limit-batches``); subclasses set their own ``out`` default.
    """

    out: str = "runs"
    seed: int = 0
    device: str = "auto"
    overwrite: bool = False
    progress: bool = True
    workers: int = 0
    limit_batches: int | None = None
    strict: bool = False
    metric_output: str | None = None  # the output scored (name or index; None: the first)
    threads: int | None = None  # CPU threads (trtqat.threads; None: torch's and ORT's own)

    def __post_init__(self) -> None:
        if not str(self.out):
            raise ConfigError("--out must name a run folder")
        check_positive(self, "workers", zero=True)
        if self.threads is not None and (isinstance(self.threads, bool)
                                         or not isinstance(self.threads, int) or self.threads < 1):
            raise ConfigError(f"--threads must be a whole number >= 1, got {self.threads!r}")
        check_positive(self, "limit_batches", "batch_size", "stop_after", allow_none=True)
        if getattr(self, "resume", False) and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        if hasattr(self, "skip_layers"):
            self.skip_layers = tuple(self.skip_layers or ())
        check_amp(self)

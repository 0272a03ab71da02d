"""Checkpoint health: a NaN stop keeps, and names, only a checkpoint that is finite.

An epoch whose model (parameters, buffers such as BatchNorm's ``running_var``) or validation
loss is not finite stops training before its checkpoint is written, so ``last.pt`` and
``best.pt`` always hold the last finite epoch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

from trtqat.errors import TrtqatError
from trtqat.finite import describe, first_non_finite, model_tensors
from trtqat.runs import distributed as D


class NonFiniteLossError(TrtqatError, FloatingPointError):
    """The training loss (or the model) became NaN or infinite."""


def check_epoch(model: nn.Module, val_loss: float, epoch: int, ctx: D.DistContext) -> None:
    """Raise :class:`NonFiniteLossError` (on every rank at once) if the model or its
    validation loss is not finite after ``epoch``."""
    found = first_non_finite(model_tensors(D.unwrap(model)))
    ok = found is None and math.isfinite(val_loss)
    if D.all_true(ctx, ok):
        return
    what = describe(found) if found else f"the validation loss is {val_loss:g}"
    raise NonFiniteLossError(f"the model is not finite after epoch {epoch} ({what})")


def finite_checkpoint(path: Path) -> bool:
    """Whether ``path`` loads and holds finite weights, buffers and validation loss."""
    from trtqat.runs.checkpoint import load_checkpoint

    try:
        ckpt = load_checkpoint(path)
    except Exception:  # noqa: BLE001 - any unreadable file is not a good checkpoint
        return False
    loss = (ckpt.get("metrics") or {}).get("val_loss", 0.0)
    return first_non_finite(ckpt["state_dict"].items()) is None and math.isfinite(float(loss))


def kept_message(out: Path, run: Any = None) -> str:
    """What a NaN stop leaves in the run folder ``out``, checked, in one sentence. Without
    any checkpoint, ``run`` (its :class:`~trtqat.runs.run_dir.RunDir`) is discarded: a
    stopped run leaves no half-written folder behind."""
    for name in ("last.pt", "best.pt"):
        path = Path(out) / name
        if path.is_file() and finite_checkpoint(path):
            return f"The last finite checkpoint is kept: {path}."
    if any((Path(out) / n).is_file() for n in ("last.pt", "best.pt")):
        return f"No finite checkpoint is left in {out}."
    if run is not None:
        run.discard()
        return "No epoch finished, so no checkpoint was written (and no run folder is left)."
    return "No epoch finished, so no checkpoint was written."

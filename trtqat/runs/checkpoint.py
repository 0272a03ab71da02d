"""Checkpoints: one ``.pt`` file per stage, written atomically, loaded with weights_only.

A checkpoint is a dict of plain types and tensors only:

    format      "trtqat-checkpoint/1"
    stage       "fp32" | "ptq" | "qat"
    model       {"arch", "num_classes", "image_size", "quantized", "skip_layers"} and, when
                recorded, "family" (the model family's registry name; untagged: an image
                classifier), "source" (model source, file and weights with SHA-256) and
                "preprocess" (size, resize, mean, std, channels). Encoders keep their own
                entry (``trtqat.families.encoder.checkpoint``).
    state_dict  model weights (and quantizer amax buffers for quantized stages)
    optimizer, scheduler, epoch, rng, metrics, calib, args   (optional)

Written by the recipes as well: ``rng`` is a list with one RNG state per rank,
``best_top1`` and ``wall_time_s`` let ``--resume`` continue the bookkeeping, ``args`` holds
the resolved options of the stage that wrote the file, ``train_args`` (ptq/qat) those of the
FP32 run, and ``calib`` (ptq/qat) {"method", "percentile", "num_batches", "batches_seen",
"world_size", "source"}.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trtqat.atomic import fill_atomic, publish, temp_path, write_failed
from trtqat.errors import TrtqatError
from trtqat.finite import check_finite_arrays

FORMAT = "trtqat-checkpoint/1"


class CheckpointError(TrtqatError, RuntimeError):
    """A checkpoint is missing, unreadable or of the wrong kind."""


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` through a temporary file and an atomic rename.

    Refused (:class:`~trtqat.finite.NonFiniteError`) when a parameter or buffer of its
    ``state_dict`` is NaN or inf: a poisoned model never replaces a good checkpoint.
    """
    path = Path(path)
    check_finite_arrays((payload.get("state_dict") or {}).items(), f"the model to save in {path}",
                        "no checkpoint written; lower --lr and start again")
    payload = {"format": FORMAT, **payload}
    try:
        tmp = temp_path(path)
    except OSError as exc:
        raise write_failed(path, exc) from None
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
        publish(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        cause = _os_error(exc)  # torch's zip writer may wrap the OSError in a RuntimeError
        if cause is not None:
            raise write_failed(path, cause, "no checkpoint written") from None
        raise
    return path


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError ``exc`` is or was raised from (its cause or context chain), if any."""
    for _ in range(8):
        if exc is None or isinstance(exc, OSError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def copy_checkpoint(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Atomically make ``dst`` a copy of ``src`` (a hard link when the file system allows).

    A later atomic replace of ``src`` leaves ``dst`` untouched: it keeps the old content.
    """
    src = Path(src)

    def fill(tmp: Path) -> None:
        tmp.unlink()  # os.link needs a free name
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)

    return fill_atomic(dst, fill)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a trtqat checkpoint (tensors and plain types only: ``weights_only=True``)."""
    path = Path(path)
    try:
        path.stat()
    except OSError as exc:  # e.g. a name longer than the file system allows
        if exc.errno != errno.ENOENT:
            raise CheckpointError(f"checkpoint {str(path)[:120]}: {exc.strerror or exc}; "
                                  "check the path") from None
    if path.is_dir():
        for name in ("best.pt", "last.pt"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise CheckpointError(f"{path} holds no best.pt or last.pt: run the stage that "
                                  "writes it first")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: check the path, or run "
                              "`trtqat train` first")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated file, not a torch file, unpickling refused
        # torch's own text advises an unpickling load, which must never be used on a file
        # of unknown origin: say what the file is instead
        from trtqat.runs.pickled import reason

        why = reason(exc)
        detail = "" if why.startswith("it ") else f" ({why[:120]})"
        raise CheckpointError(f"cannot read checkpoint {path}: it is not a file of tensors and "
                              "plain types (corrupt, truncated, or it holds Python objects, "
                              f"which trtqat never unpickles){detail}; pass a .pt written by "
                              "trtqat train/calibrate/qat") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a trtqat checkpoint (no '{FORMAT}' marker): "
                              "pass a .pt written by trtqat train/calibrate/qat")
    _check_fields(path, ckpt)
    return ckpt


# The keys a checkpoint's "model" entry must hold, asked of its family: the registry of
# model families (trtqat.families, above this module) registers the function on import.
_spec_keys: list[Callable[[dict[str, Any]], Sequence[str]]] = []


def register_spec_keys(fn: Callable[[dict[str, Any]], Sequence[str]]) -> None:
    """Make :func:`load_checkpoint` check that ``ckpt["model"]`` holds ``fn(ckpt)``'s keys."""
    _spec_keys[:] = [fn]


def _check_fields(path: Path, ckpt: dict[str, Any]) -> None:
    """The keys every stage reads: a damaged or hand-made checkpoint is one clear line."""
    spec = ckpt.get("model")
    problem = None
    if not isinstance(spec, dict):
        problem = "no 'model' description"
    else:
        keys = _spec_keys[0](ckpt) if _spec_keys else ()  # the family's (registered)
        if not set(keys) <= set(spec):
            problem = f"its 'model' entry lacks {' or '.join(repr(k) for k in keys)}"
        elif not isinstance(ckpt.get("state_dict"), dict):
            problem = "no 'state_dict' (the model weights)"
        else:
            _check_amax(path, ckpt["state_dict"])
    if problem:
        raise CheckpointError(f"{path} is an incomplete trtqat checkpoint ({problem}): pass a "
                              ".pt written by trtqat train/calibrate/qat, unmodified")


def _check_amax(path: Path, state: dict[str, Any]) -> None:
    """Refuse a quantizer range (``*._amax``) below zero, naming the value."""
    for key, value in state.items():
        if key.endswith("_amax") and isinstance(value, torch.Tensor) and value.numel() \
                and value.is_floating_point() and bool((value < 0).any()):
            name = key.rsplit(".", 1)[0]
            raise CheckpointError(f"{path}: quantizer '{name}' has amax {float(value.min()):g}, "
                                  "which is negative (a range is >= 0): calibrate again "
                                  "(`trtqat calibrate`) or pass an unmodified checkpoint")

"""Arrays from ``.npy``/``.npz`` files, with clear errors (numpy only: no torch import).

``load_array("x.npy")``, ``load_array("x.npz")`` (its first array) or
``load_array("x.npz:images")`` (a named one). Used for calibration tensors and usable by
the engines for ``--loadInputs``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from trtqat.errors import TrtqatError

ARRAY_SUFFIXES = (".npy", ".npz")


class ArrayFileError(TrtqatError, ValueError):
    """An array file is missing, unreadable, or holds the wrong kind of array."""


def split_array_spec(spec: str | os.PathLike) -> tuple[Path, str | None]:
    """``"x.npz:name"`` -> ``(Path("x.npz"), "name")``; a plain path -> ``(path, None)``."""
    text = str(spec)
    head, sep, name = text.rpartition(":")
    if sep and head.lower().endswith(".npz") and name and "/" not in name and "\\" not in name:
        return Path(head), name
    return Path(text), None


def is_array_spec(spec: str | os.PathLike) -> bool:
    """True if ``spec`` names a ``.npy``/``.npz`` file (optionally ``.npz:name``)."""
    path, _ = split_array_spec(spec)
    return path.suffix.lower() in ARRAY_SUFFIXES


def reason_of(exc: BaseException) -> str:
    """numpy's reason in one line; never its advice to allow pickles."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "allow_pickle" in first or "pickle" in type(exc).__name__.lower():
        return ("it holds pickled Python objects, which trtqat does not load: save a numeric "
                "array (np.save(PATH, array.astype(np.float32)))")
    return first


def load_array(spec: str | os.PathLike, *, ndim: int | None = None,
               what: str = "array") -> np.ndarray:
    """The array in ``spec`` (``.npy``, ``.npz`` first array, or ``.npz:name``).

    ``ndim`` checks the number of dimensions; ``what`` names the array in error messages.
    Pickled object arrays are refused (``allow_pickle=False``).
    """
    path, name = split_array_spec(spec)
    if path.suffix.lower() not in ARRAY_SUFFIXES:
        raise ArrayFileError(f"{path}: not a .npy or .npz file")
    if not path.is_file():
        raise ArrayFileError(f"{path}: no such file (expected a {path.suffix} {what})")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:  # truncated, not numpy, pickled objects
        raise ArrayFileError(f"cannot read {path}: {reason_of(exc)}") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            keys = list(loaded.files)
            if not keys:
                raise ArrayFileError(f"{path} holds no arrays")
            if name is not None and name not in keys:
                raise ArrayFileError(f"{path} has no array {name!r}; it holds "
                                     f"{', '.join(keys[:8])}")
            try:
                array = loaded[name or keys[0]]
            except Exception as exc:
                raise ArrayFileError(f"cannot read array {name or keys[0]!r} of {path}: "
                                     f"{reason_of(exc)}") from None
    else:
        if name is not None:
            raise ArrayFileError(f"{path} is a .npy file: it has no named arrays (drop :{name})")
        array = loaded
    if ndim is not None and array.ndim != ndim:
        raise ArrayFileError(f"{spec}: the {what} has shape {tuple(array.shape)}, expected "
                             f"{ndim} dimensions")
    return array


def row_cosines(a, b) -> np.ndarray:
    """Cosine similarity of each row (last axis) of ``a`` with the same row of ``b``.

    Computed in float64 over ``(..., dim)`` arrays flattened to rows; a zero row gives 0.
    The one cosine of trtqat: export checks, compare, metrics and the engines use it.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim == 0:
        raise ValueError(f"cosines need two arrays of one shape, got {a.shape} and {b.shape}")
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(den, np.finfo(np.float64).tiny)

"""What a path-like ``--model`` is, probed without crashing or running anything.

Families claim ``--model`` strings (:meth:`ModelFamily.claims_model`); those that name files
ask here. :func:`probe` never raises (a name longer than the file system allows is simply
not there); :func:`is_path_like` tells a path from a model name, so that a path no family
claims gets one line listing what ``--model`` takes (:func:`unclaimed_reason`).
"""

from __future__ import annotations

import os
from pathlib import Path

# suffixes of files, never of model names (timm names have dots: resnet50.a1_in1k)
FILE_SUFFIXES = frozenset({".pt", ".pth", ".yaml", ".yml", ".onnx", ".bin", ".ckpt", ".tar",
                           ".safetensors", ".json", ".engine", ".npz", ".npy", ".zip", ".py"})


def probe(path: str | os.PathLike) -> str | None:
    """``"file"``, ``"dir"`` or None (absent, unreadable, or a name too long to exist)."""
    try:
        p = Path(path).expanduser()
        if p.is_file():
            return "file"
        if p.is_dir():
            return "dir"
    except (OSError, ValueError, RuntimeError):  # ENAMETOOLONG, NUL bytes, no home folder
        return None
    return None


def is_path_like(model: str) -> bool:
    """True when ``--model`` is written as a path (a folder part, ``~``, ``.``, or a file
    suffix) rather than a model name."""
    return ("/" in model or "\\" in model or model.startswith(("~", "."))
            or Path(model).suffix.lower() in FILE_SUFFIXES)


def unclaimed_reason(model: str) -> str:
    """Why no family took the path ``model``, in a few words."""
    kind = probe(model)
    suffix = Path(model).suffix.lower()
    if kind is None:
        return "no such file or folder"
    if kind == "dir":
        return "a folder with no config.json (not a Hugging Face model folder)"
    if suffix in (".pt", ".pth"):
        return ("a .pt that is not an Ultralytics model (a trtqat checkpoint goes to "
                "--checkpoint, float weights to --weights)")
    if suffix in (".yaml", ".yml"):
        return "a .yaml that is not an Ultralytics model (no backbone and head keys)"
    return f"trtqat builds no model from a {suffix or 'suffix-less'} file"

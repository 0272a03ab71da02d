"""Import a user's model file (``--model path/to/file.py:factory``) from verified bytes.

The file is read once; those bytes are hashed (and compared with the SHA-256 a checkpoint
recorded, when rebuilding from one), compiled and executed into a fresh module. No bytecode
cache is read or written: a ``__pycache__/*.pyc`` whose header matches the source (same
mtime and size) but whose code differs never runs, and what runs is what was hashed.
"""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
from pathlib import Path

from trtqat.errors import TrtqatError

MODULE_PREFIX = "trtqat_user_model_"
_EXECUTED: dict[str, str] = {}  # resolved path -> SHA-256 of the bytes last executed


class ModelSourceError(TrtqatError, ValueError):
    """A model source or weights file cannot be used (missing, wrong kind, keys differ)."""


def module_name(path: Path) -> str:
    """The ``sys.modules`` name of a model file: unique per resolved path."""
    return MODULE_PREFIX + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]


def import_verified(path: Path, expected_sha256: str | None = None) -> types.ModuleType:
    """Execute the bytes of ``path`` as a new module and return it.

    ``expected_sha256``: the digest a checkpoint recorded; bytes that differ are refused
    before anything runs. The module stays in ``sys.modules`` (under :func:`module_name`) so
    that its classes pickle and its dataclasses resolve; a failed import removes it.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelSourceError(f"cannot read model file {path}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise ModelSourceError(f"the checkpoint builds its model by importing {path}, which "
                               "changed since the checkpoint was written (its SHA-256 "
                               "differs): importing it would run code you have not checked; "
                               "restore the file, or review it and pass --trust-model-file")
    name = module_name(path)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        code = compile(data, str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - the user's own model file, as imported
    except Exception as exc:  # the user's file: report it, do not crash
        sys.modules.pop(name, None)
        raise ModelSourceError(f"importing model file {path} failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    _EXECUTED[str(path.resolve())] = digest
    try:  # tracebacks and inspect.getsource show the executed text, not a later edit
        lines = data.decode("utf-8").splitlines(True)
        linecache.cache[str(path)] = (len(data), None, lines, str(path))
    except UnicodeDecodeError:  # a coding cookie: linecache reads the file itself
        pass
    return module


def executed_sha256(path: Path) -> str | None:
    """SHA-256 of the bytes of ``path`` this process last executed (None: not imported)."""
    return _EXECUTED.get(str(path.resolve()))

"""Output paths checked against the inputs and each other, after resolving them.

``w/sub/../e.engine``, ``./e.engine`` and a symbolic link to ``e.engine`` are one file: every
comparison here goes through :func:`path_key` (``os.path.realpath``) and, for existing files,
``os.path.samefile`` (hard links). An existing file is replaced only when a recogniser proves
it is an earlier output of the same kind (trtqat replaces only its own files).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from trtqat.errors import TrtqatError


class OutputPathError(TrtqatError, ValueError):
    """An output path that is an input, another output, or a file that is not trtqat's."""


def path_key(path: str | os.PathLike[str]) -> str:
    """The path with ``..``, ``.`` and symbolic links resolved (it need not exist)."""
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name one file (resolved, or hard links of one file)."""
    if path_key(a) == path_key(b):
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_file(out: str | os.PathLike[str], flag: str,
                      inputs: Iterable[tuple[str, object]], is_ours: Callable[[Path], bool],
                      kind: str, choose: str = "") -> None:
    """Refuse an output ``out`` that is one of the ``(flag, path)`` inputs, or an existing
    file that ``is_ours`` does not recognise as an earlier output of the same kind
    (``choose``: what the message asks to change, default ``flag``)."""
    path = Path(out)
    choose = choose or flag
    for in_flag, value in inputs:
        if value and same_path(path, str(value)):
            raise OutputPathError(f"{flag} {path} is also the input {in_flag}: writing it "
                                  f"would destroy the input; choose another {choose}")
    if path.exists() and not path.is_file():
        raise OutputPathError(f"{flag} {path} exists and is not a file; choose another "
                              f"{choose}")
    if path.is_file() and not is_ours(path):
        raise OutputPathError(f"{flag} {path} exists and is not {kind}: trtqat does not "
                              "overwrite other files; delete it or choose another "
                              f"{choose}")


class Claims:
    """The outputs of one command so far: two that resolve to one file are refused."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def claim(self, flag: str, path: str | os.PathLike[str]) -> None:
        """Record ``path`` for ``flag``, or raise :class:`OutputPathError` if taken."""
        key = path_key(path)
        if key in self._seen:
            raise OutputPathError(f"{flag} {path} is also {self._seen[key]}: each output "
                                  "needs its own file; choose another path")
        self._seen[key] = flag

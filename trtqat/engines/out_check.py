"""Where an engine may be saved: not over an input, another output, or a file that is not an
earlier engine (with its trtqat sidecar). Used by ``trtqat build``, ``trtqat-exec
--saveEngine`` and ``trtqat.build_engine(out=...)`` alike."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from trtqat.engines.fileformat import MAGIC, SIDECAR_FORMAT, sidecar_path
from trtqat.out_paths import Claims, check_output_file


def is_sidecar_file(path: Path) -> bool:
    """A trtqat engine sidecar (``<engine>.json`` with trtqat's format marker)."""
    try:
        if path.stat().st_size > 16 << 20:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == SIDECAR_FORMAT


def is_engine_file(path: Path) -> bool:
    """An earlier engine artifact: a trtqat engine file, a TensorRT plan ('ftrt' magic), or
    a file with a trtqat sidecar (``<engine>.json``) beside it."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        return False
    return head.startswith(MAGIC) or head[:4] == b"ftrt" or is_sidecar_file(sidecar_path(path))


def check_engine_output(out: str | os.PathLike[str], flag: str,
                        inputs: Iterable[tuple[str, object]], claims: Claims | None = None,
                        choose: str = "") -> None:
    """Refuse ``out`` (and its sidecar) where it is an input, another output in ``claims``,
    or an existing file that is not an earlier engine (sidecar: not a trtqat sidecar):
    :class:`~trtqat.out_paths.OutputPathError`."""
    claims = claims if claims is not None else Claims()
    inputs = list(inputs)
    claims.claim(flag, out)
    check_output_file(out, flag, inputs, is_engine_file, "an engine file", choose)
    side = sidecar_path(out)
    claims.claim(f"the sidecar of {flag}", side)
    check_output_file(side, f"the sidecar of {flag}", inputs, is_sidecar_file,
                      "a trtqat engine sidecar", choose=choose or flag)

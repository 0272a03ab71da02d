"""The engine file: one JSON header line plus the backend's bytes, written atomically.

Layout: ``TRTQAT-ENGINE\\n`` + header JSON (one line) + ``\\n`` + payload. The header names
the backend and its version, the inputs/outputs and the build options, and carries the
payload's size and SHA-256 so that a truncated or corrupted file is refused on load.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trtqat.atomic import write_atomic
from trtqat.engines.errors import EngineFileError

MAGIC = b"TRTQAT-ENGINE\n"
FORMAT_VERSION = 1
_MAX_HEADER = 16 << 20


def atomic_write(path: str | os.PathLike[str], chunks: bytes | Iterable[bytes]) -> Path:
    """Write to a temporary file beside ``path`` and rename it: readers never see half a file."""
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = [bytes(chunks)]

    def write(f) -> None:
        for chunk in chunks:
            f.write(chunk)

    return write_atomic(path, write)


def write_engine_file(path: str | os.PathLike[str], header: dict[str, Any],
                      payload: bytes) -> Path:
    """Save ``header`` + ``payload`` as an engine file (atomically)."""
    full = dict(header, format=FORMAT_VERSION, payload_size=len(payload),
                payload_sha256=hashlib.sha256(payload).hexdigest())
    line = json.dumps(full, separators=(",", ":"), sort_keys=True).encode()
    return atomic_write(path, [MAGIC, line, b"\n", payload])


def read_engine_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, bytes]:
    """Read an engine file: ``(header, payload)``, or ``(None, raw bytes)`` without our header.

    Raises EngineFileError for a missing file or a damaged/truncated trtqat engine file.
    """
    p = Path(path)
    if p.is_dir():
        raise EngineFileError(f"{p} is a folder, not an engine file; give the engine file "
                              "itself, e.g. --loadEngine=engines/model.engine")
    if not p.is_file():
        raise EngineFileError(f"engine file {p} does not exist; build one with "
                              f"'trtqat build --onnx MODEL.onnx --out {p}'")
    data = p.read_bytes()
    if not data.startswith(MAGIC):
        return None, data
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    try:
        if end < 0:
            raise ValueError("no end of header")
        header = json.loads(data[len(MAGIC):end])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
    except ValueError:
        raise EngineFileError(f"engine file {p} has a damaged header (truncated?); "
                              "rebuild it with 'trtqat build'") from None
    if header.get("format") != FORMAT_VERSION:
        raise EngineFileError(f"engine file {p} has format {header.get('format')!r}, this trtqat "
                              f"reads format {FORMAT_VERSION}; rebuild it with 'trtqat build'")
    payload = data[end + 1:]
    if len(payload) != header.get("payload_size"):
        raise EngineFileError(f"engine file {p} is truncated ({len(payload)} of "
                              f"{header.get('payload_size')} payload bytes); rebuild it")
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise EngineFileError(f"engine file {p} is corrupted (checksum mismatch); rebuild it")
    return header, payload

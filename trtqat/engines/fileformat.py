"""Engine files: a plain payload plus a ``<engine>.json`` sidecar, written atomically.

The engine file holds exactly the backend's bytes: a TensorRT plan as ``IHostMemory``
returned it (``trtexec --loadEngine``, Triton and Polygraphy load it), or ONNX Runtime's
optimised ``.onnx`` model. trtqat's metadata (backend and versions, source ONNX hash,
inputs/outputs, build options, the payload's size and SHA-256) goes beside it in
``<engine>.json``. Reading detects the kind from the content (ONNX protobuf or not), so files
without a sidecar load too.

Files of the old container layout (``TRTQAT-ENGINE\\n`` + header JSON line + payload) are
still read, with a deprecation note.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from trtqat.atomic import publish, temp_path, write_atomic, write_failed
from trtqat.engines.errors import EngineFileError

log = logging.getLogger(__name__)

MAGIC = b"TRTQAT-ENGINE\n"  # the deprecated container layout
FORMAT_VERSION = 1
SIDECAR_FORMAT = "trtqat-engine-sidecar"
SIDECAR_VERSION = 1
_MAX_HEADER = 16 << 20
KIND_ONNX, KIND_PLAN = "onnx", "plan"


def atomic_write(path: str | os.PathLike[str], chunks: bytes | Iterable[bytes]) -> Path:
    """Write to a temporary file beside ``path`` and rename it: readers never see half a file."""
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = [bytes(chunks)]

    def write(f) -> None:
        for chunk in chunks:
            f.write(chunk)

    return write_atomic(path, write)


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """``engines/m.engine`` -> ``engines/m.engine.json``."""
    p = Path(path)
    return p.with_name(p.name + ".json")


def looks_like_onnx(data: bytes) -> bool:
    """True when ``data`` parses as an ONNX model with an IR version and graph nodes."""
    try:
        model = onnx.load_from_string(data)
    except Exception:  # any parse failure means "not ONNX"
        return False
    return model.ir_version > 0 and len(model.graph.node) > 0


@dataclass
class EngineFile:
    """What :func:`read_engine_files` found: payload, metadata (or None) and content kind."""

    path: Path
    payload: bytes
    header: dict[str, Any] | None
    kind: str  # KIND_ONNX or KIND_PLAN (not ONNX: a TensorRT plan, if anything)
    legacy: bool = False


def write_engine_files(path: str | os.PathLike[str], header: dict[str, Any],
                       payload: bytes) -> Path:
    """Write ``payload`` unchanged to ``path`` and ``header`` to ``<path>.json``.

    Both files are written in full to temporary files first and only then renamed into
    place, so a full disk (or any failed write) leaves the old pair, or nothing, never an
    engine without its sidecar (:class:`~trtqat.atomic.WriteError`).
    """
    payload = bytes(payload)
    target = Path(path)
    meta = {k: v for k, v in header.items() if k not in ("sidecar", "format", "payload_size",
                                                          "payload_sha256")}
    meta.update(format=SIDECAR_FORMAT, format_version=SIDECAR_VERSION,
                engine_file=target.name, payload_size=len(payload),
                payload_sha256=hashlib.sha256(payload).hexdigest())
    side = json.dumps(meta, indent=2, sort_keys=True).encode() + b"\n"
    temps: list[Path] = []
    try:
        for data, dest in ((payload, target), (side, sidecar_path(target))):
            temps.append(temp_path(dest))
            with open(temps[-1], "wb") as f:
                f.write(data)
        publish(temps[0], target)
        publish(temps[1], sidecar_path(target))
    except OSError as exc:
        raise write_failed(target, exc, "no engine was written") from None
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return target


def _read_sidecar(path: Path, payload: bytes) -> dict[str, Any] | None:
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        header = json.loads(side.read_text())
        if not isinstance(header, dict) or header.get("format") != SIDECAR_FORMAT:
            raise ValueError("not a trtqat sidecar")
    except (ValueError, UnicodeDecodeError):
        # another tool's JSON (or a damaged one): the engine itself is still checked by content
        log.warning("%s is not a trtqat engine sidecar (damaged, or another tool's file); "
                    "loading %s without trtqat's metadata", side, path)
        return None
    fix = f"rebuild the engine, or delete {side} to load the file without trtqat's metadata"
    version = header.get("format_version", SIDECAR_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise EngineFileError(f"{side} has format_version {version!r}, not a version number "
                              f"(damaged); {fix}")
    if version > SIDECAR_VERSION:
        raise EngineFileError(f"{side} has format_version {version}, written by a newer trtqat "
                              f"(this one reads up to {SIDECAR_VERSION}): upgrade trtqat, or "
                              "rebuild the engine with this one")
    if (len(payload) != header.get("payload_size")
            or hashlib.sha256(payload).hexdigest() != header.get("payload_sha256")):
        raise EngineFileError(f"{path} does not match its sidecar {side.name} (truncated, "
                              f"corrupted or replaced by another tool); {fix}")
    return header


def read_engine_files(path: str | os.PathLike[str]) -> EngineFile:
    """Read an engine file (plain, with or without sidecar, or the deprecated container).

    Raises EngineFileError for a missing, empty or damaged file, or a sidecar that does not
    match its engine.
    """
    p = Path(path)
    if p.is_dir():
        raise EngineFileError(f"{p} is a folder, not an engine file; give the engine file "
                              "itself, e.g. --loadEngine=engines/model.engine")
    if not p.is_file():
        raise EngineFileError(f"engine file {p} does not exist; build one with "
                              f"'trtqat build --onnx MODEL.onnx --out {p}'")
    data = p.read_bytes()
    if not data:
        raise EngineFileError(f"engine file {p} is empty; rebuild it with 'trtqat build'")
    if data.startswith(MAGIC):
        header, payload = _read_container(p, data)
        log.warning("%s uses trtqat's old container layout (deprecated: only trtqat can read "
                    "it); re-save it as a plain engine with 'trtqat-exec --loadEngine=%s "
                    "--saveEngine=NEW --skipInference'", p, p)
        kind = KIND_ONNX if looks_like_onnx(payload) else KIND_PLAN
        return EngineFile(p, payload, header, kind, legacy=True)
    if _looks_like_json(data):
        raise EngineFileError(f"{p} is a JSON file, not an engine; pass the engine file itself "
                              "(the sidecar is found beside it)")
    kind = KIND_ONNX if looks_like_onnx(data) else KIND_PLAN
    return EngineFile(p, data, _read_sidecar(p, data), kind)


def _looks_like_json(data: bytes) -> bool:
    """True for text opening with ``{`` or ``[`` (a sidecar or report, even a damaged one);
    binary data that merely starts with that byte is not text."""
    head = data[:64]
    if head.lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut by the 64-byte slice is still text
        if exc.reason != "unexpected end of data":
            return False
        text = head[:exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def _read_container(p: Path, data: bytes) -> tuple[dict[str, Any], bytes]:
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


def write_container_file(path: str | os.PathLike[str], header: dict[str, Any],
                         payload: bytes) -> Path:
    """The deprecated container layout; kept only so tests can make old files."""
    full = dict(header, format=FORMAT_VERSION, payload_size=len(payload),
                payload_sha256=hashlib.sha256(payload).hexdigest())
    line = json.dumps(full, separators=(",", ":"), sort_keys=True).encode()
    return atomic_write(path, [MAGIC, line, b"\n", payload])

"""Whether a ``.yaml`` or ``.pt`` is an Ultralytics model, decided without running it.

A ``.yaml`` is read with ``yaml.safe_load`` (a model yaml has ``backbone`` and ``head``); a
name alone (no folder) that follows Ultralytics' naming (``yolov8n.yaml``,
``yolo11n-seg.yaml``, ``rtdetr-l.yaml``) is one Ultralytics builds from its own package. A
``.pt`` is never unpickled to decide: its zip archive's ``data.pkl`` is scanned with
:mod:`pickletools` (which only parses) for classes of the ``ultralytics`` package.
"""

from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path

from trtqat.families.model_paths import probe

BUNDLED_YAML = re.compile(r"^(yolo|rtdetr)[A-Za-z0-9_.-]*\.ya?ml$", re.IGNORECASE)
MAX_YAML_BYTES = 1 << 20
MAX_PICKLE_BYTES = 64 << 20
_STRINGS = ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING",
            "BINSTRING", "STRING")


def is_ultralytics_yaml(model: str) -> bool:
    """An Ultralytics model yaml: a file with ``backbone`` and ``head`` keys, or (not a
    file) a bare name in Ultralytics' naming, built from its package."""
    kind = probe(model)
    if kind is None:
        return "/" not in model and "\\" not in model and bool(BUNDLED_YAML.match(model))
    if kind != "file":
        return False
    import yaml

    try:
        path = Path(model).expanduser()
        if path.stat().st_size > MAX_YAML_BYTES:
            return False
        spec = yaml.safe_load(path.read_text(errors="replace"))
    except (OSError, yaml.YAMLError, ValueError):
        return False
    return isinstance(spec, dict) and "backbone" in spec and "head" in spec


def is_ultralytics_pt(model: str) -> bool:
    """A torch zip archive whose pickle names classes of the ``ultralytics`` package (read
    with ``pickletools``: nothing is unpickled)."""
    if probe(model) != "file":
        return False
    try:
        with zipfile.ZipFile(Path(model).expanduser()) as archive:
            member = next((i for i in archive.infolist()
                           if i.filename.rsplit("/", 1)[-1] == "data.pkl"), None)
            if member is None or member.file_size > MAX_PICKLE_BYTES:
                return False
            data = archive.read(member)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        return False
    return _names_ultralytics(data)


def _names_ultralytics(data: bytes) -> bool:
    """True when the pickle ``data`` refers to a global of the ``ultralytics`` package."""
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and isinstance(arg, str):
                module = arg.split(" ", 1)[0]
            elif op.name in _STRINGS and isinstance(arg, (str, bytes)):
                module = arg.decode("latin-1") if isinstance(arg, bytes) else arg
                if "." not in module:  # STACK_GLOBAL's module strings: ultralytics.nn....
                    continue
            else:
                continue
            if module == "ultralytics" or module.startswith("ultralytics."):
                return True
    except Exception:  # noqa: BLE001 - a damaged pickle: not one we recognise
        return False
    return False

"""Whether a ``.yaml`` or ``.pt`` is an Ultralytics model, and of which task, decided
without running it (the detection family takes detectors, the CNN family classifiers).

A ``.yaml`` is read with ``yaml.safe_load`` (a model yaml has ``backbone`` and ``head``; its
task is its last layer's, ``Classify`` -> ``classify``); a name alone (no folder) that
follows Ultralytics' naming (``yolov8n.yaml``, ``yolo11n-seg.yaml``, ``yolo11n-cls.yaml``,
``rtdetr-l.yaml``) is one Ultralytics builds from its own package, its task in its suffix.
A ``.pt`` is never unpickled to decide: its zip archive's ``data.pkl`` is scanned with
:mod:`pickletools` (which only parses) for classes of the ``ultralytics`` package (the task
is that of its first ``ultralytics.nn.tasks`` model class).
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
NAME_TASKS = {"cls": "classify", "seg": "segment", "pose": "pose", "obb": "obb"}
LAYER_TASKS = {"classify": "classify", "segment": "segment", "pose": "pose", "obb": "obb"}
MODEL_TASKS = {"ClassificationModel": "classify", "SegmentationModel": "segment",
               "PoseModel": "pose", "OBBModel": "obb", "DetectionModel": "detect"}
_STRINGS = ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING",
            "BINSTRING", "STRING")


def _yaml_spec(model: str) -> dict | None:
    """The dict of a model yaml file (None: not a readable yaml of a model)."""
    import yaml

    try:
        path = Path(model).expanduser()
        if path.stat().st_size > MAX_YAML_BYTES:
            return None
        spec = yaml.safe_load(path.read_text(errors="replace"))
    except (OSError, yaml.YAMLError, ValueError):
        return None
    return spec if isinstance(spec, dict) and "backbone" in spec and "head" in spec else None


def is_ultralytics_yaml(model: str) -> bool:
    """An Ultralytics model yaml: a file with ``backbone`` and ``head`` keys, or (not a
    file) a bare name in Ultralytics' naming, built from its package."""
    kind = probe(model)
    if kind is None:
        return "/" not in model and "\\" not in model and bool(BUNDLED_YAML.match(model))
    return kind == "file" and _yaml_spec(model) is not None


def _pickle_of(model: str) -> bytes | None:
    """The ``data.pkl`` of a torch zip archive (None: not one, or too large)."""
    if probe(model) != "file":
        return None
    try:
        with zipfile.ZipFile(Path(model).expanduser()) as archive:
            member = next((i for i in archive.infolist()
                           if i.filename.rsplit("/", 1)[-1] == "data.pkl"), None)
            if member is None or member.file_size > MAX_PICKLE_BYTES:
                return None
            return archive.read(member)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        return None


def is_ultralytics_pt(model: str) -> bool:
    """A torch zip archive whose pickle names classes of the ``ultralytics`` package (read
    with ``pickletools``: nothing is unpickled)."""
    data = _pickle_of(model)
    return data is not None and bool(_ultralytics_globals(data))


def ultralytics_task(model: str) -> str | None:
    """``classify``, ``detect``, ``segment``, ``pose`` or ``obb``: the task of an Ultralytics
    ``.yaml``/``.pt`` (None: not one), read without building or unpickling it."""
    suffix = Path(model).suffix.lower()
    if suffix in (".yaml", ".yml") and is_ultralytics_yaml(model):
        spec = _yaml_spec(model) if probe(model) == "file" else None
        if spec is None:  # a bundled name: yolo11n-cls.yaml, yolov8-cls-resnet50.yaml
            parts = Path(model).stem.lower().split("-")[1:]
            return next((NAME_TASKS[p] for p in parts if p in NAME_TASKS), "detect")
        try:
            layer = str(spec["head"][-1][2]).lower()
        except (TypeError, KeyError, IndexError):
            return "detect"
        return next((t for k, t in LAYER_TASKS.items() if layer.endswith(k)), "detect")
    if suffix == ".pt":
        data = _pickle_of(model)
        found = _ultralytics_globals(data) if data is not None else []
        if not found:
            return None
        names = [g.rpartition(" ")[2] for g in found]
        return next((MODEL_TASKS[n] for n in names if n in MODEL_TASKS), "detect")
    return None


def _ultralytics_globals(data: bytes) -> list[str]:
    """The globals of the ``ultralytics`` package the pickle ``data`` refers to, in order
    (``module name``; [] for a damaged pickle: not one we recognise)."""
    found: list[str] = []
    module = ""  # STACK_GLOBAL: a module string, then the name string
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and isinstance(arg, str):
                if arg.split(" ", 1)[0].split(".")[0] == "ultralytics":
                    found.append(arg)
                module = ""
            elif op.name in _STRINGS and isinstance(arg, (str, bytes)):
                text = arg.decode("latin-1") if isinstance(arg, bytes) else arg
                if module:
                    found[-1] = f"{module} {text}"
                    module = ""
                elif text == "ultralytics" or text.startswith("ultralytics."):
                    found.append(text)
                    module = text
            else:
                module = "" if op.name != "MEMOIZE" else module
    except Exception:  # noqa: BLE001 - a damaged pickle: not one we recognise
        return []
    return found


def untrusted_pt(source: str) -> str | None:
    """The one-line refusal of an Ultralytics ``.pt`` without ``--trust-model-file``
    (Ultralytics unpickles it, and unpickling runs whatever code the file carries); None
    when model files are trusted."""
    from trtqat.runopts import model_files_trusted

    if model_files_trusted():
        return None
    return (f"--model {source}: an Ultralytics .pt is a pickle, and loading it runs any code "
            "it carries; pass --trust-model-file if you trust where the file came from "
            "(Python: with trtqat.runopts.trusting_model_files(): ...), or start from its "
            "model .yaml")

"""An Ultralytics dataset ``data.yaml``: ``path`` (the dataset folder: absolute, or
relative to the yaml's folder), ``train`` and ``val`` (image folders, lists of them, or
``.txt`` lists of images; each relative to ``path``, else to the yaml's folder), ``names``
(a list, or an ``{id: name}`` mapping) and optionally ``nc``. Nothing is downloaded: a
``download`` key is ignored, as are ``test`` and anything else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtqat.families.detect.data_checks import DetectionDataError, inside, read_text
from trtqat.families.detect.yolo_labels import IMAGE_SUFFIXES, labels_folder, pairs

SPLIT_FIX = ("give a folder of images (e.g. images/train), a list of them, or a .txt list of "
             "image files, relative to path: or to the yaml's folder")


@dataclass
class DataYaml:
    """What a ``data.yaml`` says: ``(image, label)`` pairs per split (``val`` None: not
    given) and the class names (None: not given)."""

    path: Path
    train: list[tuple[Path, Path]]
    val: list[tuple[Path, Path]] | None
    names: list[str] | None


def _load(path: Path) -> dict[str, Any]:
    import yaml

    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DetectionDataError(f"--data {path}: not a readable YAML file ({first})") from None
    if not isinstance(spec, dict) or "train" not in spec:
        raise DetectionDataError(f"--data {path}: not a dataset yaml: it needs 'train' (and "
                                 "'val', 'names'), as Ultralytics' data.yaml files have")
    return spec


def _names(spec: dict[str, Any], path: Path) -> list[str] | None:
    names, nc = spec.get("names"), spec.get("nc")
    if isinstance(names, dict):
        keys = list(names)
        if sorted(keys, key=str) != sorted(range(len(keys)), key=str) or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in keys):
            raise DetectionDataError(f"{path}: names {{id: name}} has ids {keys[:8]}: give each "
                                     "id 0, 1, ... once, or list the names in order")
        names = [names[i] for i in range(len(keys))]
    if names is not None and (not isinstance(names, list) or not names or not all(
            isinstance(n, (str, int, float)) and not isinstance(n, bool) for n in names)):
        raise DetectionDataError(f"{path}: names must list the class names (a list, or "
                                 "{id: name}), got " + repr(spec.get("names"))[:80])
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or nc < 1):
        raise DetectionDataError(f"{path}: nc {nc!r} is not a class count: give an integer "
                                 ">= 1, or leave nc out")
    if names is not None and nc is not None and nc != len(names):
        raise DetectionDataError(f"{path}: nc is {nc} but names lists {len(names)} class(es): "
                                 "make them agree (or leave nc out)")
    if names is None:
        return None if nc is None else [str(i) for i in range(nc)]
    return [str(n) for n in names]


def _base(spec: dict[str, Any], path: Path) -> Path:
    """The dataset folder: ``path`` (relative to the yaml's folder), or the yaml's folder."""
    value = spec.get("path")
    if value in (None, ""):
        return path.parent
    if not isinstance(value, str):
        raise DetectionDataError(f"{path}: path {value!r} is not a folder: give the dataset "
                                 "folder, or leave path out (then it is the yaml's folder)")
    base = Path(value).expanduser()
    return base if base.is_absolute() else path.parent / base


def _listed(txt: Path, where: str) -> list[tuple[Path, Path]]:
    """The images a ``.txt`` list names (relative to its folder), with their labels."""
    out = []
    for n, line in enumerate(read_text(txt, "list one image a line").splitlines(), 1):
        name = line.strip()
        if not name:
            continue
        image = inside(txt.parent, name, f"{txt}:{n}")
        if image.suffix.lower() not in IMAGE_SUFFIXES:
            raise DetectionDataError(f"{txt}:{n}: {name!r} is not an image file ("
                                     f"{', '.join(IMAGE_SUFFIXES)}): list one image per line")
        folder = labels_folder(image.parent)
        out.append((image, folder / image.with_suffix(".txt").name))
    if not out:
        raise DetectionDataError(f"{where}: {txt} lists no images: {SPLIT_FIX}")
    return out


def _split(spec: dict[str, Any], key: str, base: Path, path: Path) -> list[tuple[Path, Path]]:
    value = spec[key]
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise DetectionDataError(f"{path}: {key}: {value!r} is not a path: {SPLIT_FIX}")
    out: list[tuple[Path, Path]] = []
    for entry in entries:
        tried = [Path(entry).expanduser()] if Path(entry).expanduser().is_absolute() else [
            base / entry, path.parent / entry]
        found = next((p for p in tried if p.exists()), None)
        if found is None:
            raise DetectionDataError(f"{path}: {key}: {entry} not found (looked for "
                                     f"{' and '.join(str(p) for p in dict.fromkeys(tried))}): "
                                     f"{SPLIT_FIX}")
        if found.is_dir():
            items = pairs(found)
            if not items:
                raise DetectionDataError(f"{path}: {key}: {found} holds no images (.jpg, "
                                         f".png, ...): {SPLIT_FIX}")
            out += items
        elif found.suffix.lower() == ".txt":
            out += _listed(found, f"{path}: {key}")
        else:
            raise DetectionDataError(f"{path}: {key}: {found} is neither a folder nor a .txt "
                                     f"list: {SPLIT_FIX}")
    return out


def read_data_yaml(path: Path) -> DataYaml:
    """The splits and names of the dataset yaml ``path`` (never downloads anything)."""
    spec = _load(path)
    base = _base(spec, path)
    names = _names(spec, path)
    train = _split(spec, "train", base, path)
    val = _split(spec, "val", base, path) if spec.get("val") not in (None, "") else None
    return DataYaml(base if base.is_dir() else path.parent, train, val, names)

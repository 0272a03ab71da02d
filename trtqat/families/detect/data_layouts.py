"""Where a detection ``--data`` keeps its splits, and its class names.

In this order:

* a dataset yaml (``--data path/to/data.yaml``, or a folder holding ``data.yaml``):
  :mod:`.data_yaml`;
* Ultralytics' layout: ``images/train``, ``images/val`` and ``labels/train``,
  ``labels/val`` (``valid`` also names the validation split);
* ``train/`` and ``val/`` (or ``valid/``) folders, each a COCO or a YOLO folder;
* COCO's own layout: ``annotations/instances_train*.json`` and ``instances_val*.json``,
  their images in the folders so named (``train2017/``, ``val2017/``) or beside them;
* one COCO or YOLO folder (``images/`` and ``labels/``): the caller splits it 80/20.

YOLO class names come from the yaml's ``names``, else a ``classes.txt`` (one name a line,
in the split's folder or the dataset's), else the class indices used (0 .. the largest).
Each split is checked as it is read (see :mod:`.coco_data`, :mod:`.yolo_labels`) and must
keep at least one box.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtqat.families.detect.coco_data import Record, annotation_files, coco_records
from trtqat.families.detect.data_checks import (
    DetectionDataError,
    Skipped,
    check_boxes,
    read_text,
)
from trtqat.families.detect.yolo_labels import Names, pairs, yolo_records

VAL_NAMES = ("val", "valid")
YAML_NAMES = ("data.yaml", "data.yml")
NOT_DETECTION = ("give a COCO folder (images + an annotations .json), a YOLO folder (images/ "
                 "and labels/), Ultralytics' images/{train,val} + labels/{train,val} or its "
                 "data.yaml, a folder with train/ and val/ of either, or digits")


@dataclass
class Splits:
    """The checked records of each split (``val`` None: split ``train`` 80/20) and the
    class names."""

    train: list[Record]
    val: list[Record] | None
    classes: list[str]


def data_format(root: Path) -> str:
    """``coco`` or ``yolo`` (:class:`DetectionDataError` for anything else)."""
    if (root / "images").is_dir() and (root / "labels").is_dir():
        return "yolo"
    if annotation_files(root):
        return "coco"
    raise DetectionDataError(f"--data {root}: not a detection folder; {NOT_DETECTION}")


def _val_folder(parent: Path) -> Path | None:
    return next((parent / v for v in VAL_NAMES if (parent / v).is_dir()), None)


def _classes_txt(*folders: Path) -> Names:
    for folder in folders:
        path = folder / "classes.txt"
        if path.is_file():
            text = read_text(path, "give one class name a line")
            names = [n.strip() for n in text.splitlines() if n.strip()]
            if not names:
                raise DetectionDataError(f"{path} is empty: give one class name a line")
            return Names(names, str(path))
    return Names()


def _yolo(parts: list[tuple[str, list[tuple[Path, Path]], Names]], strict: bool
          ) -> tuple[list[list[Record]], list[str]]:
    """Each ``(where, items, names)`` part read and checked; the names (given, or the class
    indices used)."""
    out, top = [], -1
    for where, items, names in parts:
        skipped = Skipped(strict)
        records, used = yolo_records(items, names, skipped)
        skipped.report(where)
        _check(records, where, "label files hold 'class cx cy w h' lines")
        out.append(records)
        top = max(top, used)
    given = parts[0][2].names
    return out, given if given is not None else [str(i) for i in range(top + 1)]


def _check(records: list[Record], where: str, fix: str) -> None:
    if not records:
        raise DetectionDataError(f"--data {where}: no readable images found")
    check_boxes(sum(len(t) for _, t in records), where,
                f"every box is missing or was left out (see the warnings above): {fix}")


def _coco(root: Path, strict: bool) -> tuple[list[Record], list[str]]:
    skipped = Skipped(strict)
    records, classes = coco_records(root, skipped)
    skipped.report(root)
    _check(records, str(root), "add annotations with a bbox inside their image")
    return records, classes


def _folder(root: Path, names: Names, strict: bool) -> tuple[list[Record], list[str]]:
    """One COCO or YOLO folder."""
    if data_format(root) == "coco":
        return _coco(root, strict)
    (records,), classes = _yolo([(str(root), pairs(root / "images"), names)], strict)
    return records, classes


def _from_yaml(path: Path, strict: bool) -> Splits:
    from trtqat.families.detect.data_yaml import read_data_yaml

    spec = read_data_yaml(path)
    names = Names(spec.names, f"{path} (names)") if spec.names is not None else _classes_txt(
        spec.path)
    parts = [(f"{path} (train)", spec.train, names)]
    if spec.val is not None:
        parts.append((f"{path} (val)", spec.val, names))
    records, classes = _yolo(parts, strict)
    return Splits(records[0], records[1] if spec.val is not None else None, classes)


def find_splits(data: str, strict: bool = False) -> Splits:
    """The checked splits and class names of the folder or yaml ``data``."""
    root = Path(data).expanduser()
    if root.is_file() and root.suffix.lower() in (".yaml", ".yml"):
        return _from_yaml(root, strict)
    if not root.is_dir():
        what = "is a file, not a folder or a .yaml" if root.exists() else "no such folder"
        raise DetectionDataError(f"--data {data}: {what}; {NOT_DETECTION}")
    own_yaml = next((root / n for n in YAML_NAMES if (root / n).is_file()), None)
    if own_yaml is not None:
        return _from_yaml(own_yaml, strict)
    images, labels = root / "images", root / "labels"
    val = _val_folder(images)
    if (images / "train").is_dir() and val is not None and labels.is_dir():
        names = _classes_txt(root)
        (train, val_records), classes = _yolo(
            [(str(images / "train"), pairs(images / "train"), names),
             (str(val), pairs(val), names)], strict)
        return Splits(train, val_records, classes)
    val = _val_folder(root)
    if (root / "train").is_dir() and val is not None:
        return _two_folders(root / "train", val, strict)
    coco_splits = _coco_split_files(root)
    if coco_splits is not None:
        return _coco_layout(root, *coco_splits, strict)
    records, classes = _folder(root, _classes_txt(root), strict)
    return Splits(records, None, classes)


def _coco_split_files(root: Path) -> tuple[Path, Path] | None:
    """COCO's ``annotations/instances_train*.json`` and ``instances_val*.json`` (one each)."""
    train = sorted((root / "annotations").glob("instances_train*.json"))
    val = sorted((root / "annotations").glob("instances_val*.json"))
    return (train[0], val[0]) if len(train) == 1 and len(val) == 1 else None


def _coco_layout(root: Path, train: Path, val: Path, strict: bool) -> Splits:
    """Each split from its own annotation file; images also in ``root/<train2017>``."""
    out = []
    for path in (train, val):
        skipped = Skipped(strict)
        folder = root / path.stem.removeprefix("instances_")
        records, classes = coco_records(root, skipped, path, (folder, root / "images"
                                                              / folder.name))
        skipped.report(path)
        _check(records, str(path), "add annotations with a bbox inside their image")
        out.append((records, classes))
    if out[0][1] != out[1][1]:
        raise DetectionDataError(f"{train} and {val} have different categories: give both the "
                                 "same list")
    return Splits(out[0][0], out[1][0], out[0][1])


def _two_folders(train: Path, val: Path, strict: bool) -> Splits:
    """``train/`` and ``val/``, each a COCO or a YOLO folder."""
    kinds = (data_format(train), data_format(val))
    if kinds == ("yolo", "yolo"):
        names = _classes_txt(train, train.parent)
        val_names = _classes_txt(val, train.parent)
        if names.names is None:
            names = val_names
        (tr, va), classes = _yolo([(str(train), pairs(train / "images"), names),
                                   (str(val), pairs(val / "images"), names)], strict)
        return Splits(tr, va, classes)
    tr, classes = _folder(train, _classes_txt(train, train.parent), strict)
    va, val_classes = _folder(val, _classes_txt(val, train.parent), strict)
    if kinds == ("coco", "coco") and classes != val_classes:
        raise DetectionDataError(f"{train} and {val} have different categories ({len(classes)} "
                                 f"vs {len(val_classes)}): give both the same list")
    return Splits(tr, va, classes if len(classes) >= len(val_classes) else val_classes)

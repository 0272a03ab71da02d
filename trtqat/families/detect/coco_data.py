"""A COCO-format detection folder: one ``*.json`` (``images``, ``annotations``,
``categories``) beside the images, beside an ``images/`` folder, or in ``annotations/``.

Every defect is named by file and image or annotation id (and index): a missing key, a
``bbox`` that is not 4 finite numbers, a negative width or height, a ``category_id`` not
among the categories, an annotation of an unknown image, an image path that is absolute or
leaves the folder, an image that is not there. Skipped with one warning per kind (errors
under ``--strict``): unreadable images, boxes of zero width or height or entirely outside
their image, images without annotations (kept as background). Crowd annotations
(``iscrowd``) are left out, as COCO's own evaluation does; boxes partly outside their image
are clipped to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.families.detect.data_checks import (
    DetectionDataError,
    Skipped,
    clip_box,
    finite,
    image_size,
    inside,
)

Record = tuple[Path, np.ndarray]


def annotation_files(root: Path) -> list[Path]:
    """The ``*.json`` files of a COCO folder (its own, then ``annotations/``'s)."""
    return sorted(root.glob("*.json")) + sorted((root / "annotations").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    try:
        coco = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DetectionDataError(f"{path}: not a readable JSON file ({exc}): give a COCO "
                                 "annotation file") from None
    if not isinstance(coco, dict) or not all(isinstance(coco.get(k), list) for k in
                                             ("images", "annotations", "categories")):
        raise DetectionDataError(f"{path} is not a COCO detection file: it needs the lists "
                                 "'images', 'annotations' and 'categories'")
    return coco


def _entry(item: Any, kind: str, i: int, keys: tuple[str, ...], path: Path, fix: str) -> str:
    """Where ``item`` is (``FILE: annotation #i (id N)``), refused unless it is an object
    holding ``keys``."""
    ident = item.get("id") if isinstance(item, dict) else None
    where = f"{path}: {kind} #{i}" + (f" (id {ident})" if ident is not None else "")
    if not isinstance(item, dict):
        raise DetectionDataError(f"{where} is not an object: {fix}")
    for key in keys:
        if key not in item:
            raise DetectionDataError(f"{where} has no '{key}': {fix}")
    return where


def _categories(coco: dict[str, Any], path: Path) -> tuple[dict[Any, int], list[str]]:
    fix = 'each category needs an id, e.g. {"id": 1, "name": "person"}'
    cats = coco["categories"]
    if not cats:
        raise DetectionDataError(f"{path}: 'categories' is empty: {fix}")
    seen: dict[Any, str] = {}
    for i, c in enumerate(cats):
        where = _entry(c, "category", i, ("id",), path, fix)
        if not isinstance(c["id"], (int, str)) or isinstance(c["id"], bool):
            raise DetectionDataError(f"{where}: id {c['id']!r} is not an integer: {fix}")
        if c["id"] in seen:
            raise DetectionDataError(f"{where}: id {c['id']!r} is used twice: give each "
                                     "category its own id")
        seen[c["id"]] = str(c.get("name", c["id"]))
    order = sorted(seen, key=lambda k: (isinstance(k, str), k))
    return {k: i for i, k in enumerate(order)}, [seen[k] for k in order]


def _images(coco: dict[str, Any], path: Path, root: Path, skipped: Skipped,
            folders: tuple[Path, ...]) -> dict[Any, tuple[Path, int, int] | None]:
    """Image id: (file, width, height), or None for an unreadable image (skipped); each
    file looked for in ``root``, ``root/images``, the json's folder and ``folders``."""
    fix = f"each image needs an id and a file_name relative to {root}"
    images: dict[Any, tuple[Path, int, int] | None] = {}
    for i, im in enumerate(coco["images"]):
        where = _entry(im, "image", i, ("id", "file_name"), path, fix)
        name = im["file_name"]
        if not isinstance(name, str) or not name:
            raise DetectionDataError(f"{where}: file_name {name!r} is not a path: {fix}")
        if not isinstance(im["id"], (int, str)) or isinstance(im["id"], bool):
            raise DetectionDataError(f"{where}: id {im['id']!r} is not an integer: {fix}")
        if im["id"] in images:
            raise DetectionDataError(f"{where}: id {im['id']!r} is used twice: give each image "
                                     "its own id")
        inside(root, name, where)
        found = next((p for p in (root / name, root / "images" / name, path.parent / name,
                                  *(f / name for f in folders)) if p.is_file()), None)
        if found is None:
            raise DetectionDataError(f"{where}: image {name} not found in {root} (nor in "
                                     f"{root / 'images'}): fix file_name or add the image")
        size = image_size(found, skipped)
        images[im["id"]] = None if size is None else (found, *size)
    return images


def _box(a: dict[str, Any], where: str) -> list[float]:
    """The annotation's ``[x, y, w, h]``, refused unless 4 finite numbers with w, h >= 0."""
    bbox = a["bbox"]
    if (not isinstance(bbox, list) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)
            or not finite([float(v) for v in bbox])):
        raise DetectionDataError(f"{where}: bbox {bbox!r} is not [x, y, width, height] (4 "
                                 "finite numbers, in pixels): fix the annotation")
    x, y, w, h = (float(v) for v in bbox)
    if w < 0 or h < 0:
        raise DetectionDataError(f"{where}: bbox {bbox!r} has a negative width or height: COCO "
                                 "boxes are [x, y, width, height] in pixels (not corners)")
    return [x, y, w, h]


def coco_records(root: Path, skipped: Skipped, path: Path | None = None,
                 folders: tuple[Path, ...] = ()) -> tuple[list[Record], list[str]]:
    """The readable images of the COCO folder ``root`` with their checked boxes (class
    index, x1, y1, x2, y2 in the image's pixels), and the class names (categories by id).
    ``path``: the annotation file (default: the folder's first); ``folders``: more places
    its images may be (inside ``root``)."""
    files = [path] if path is not None else annotation_files(root)
    if not files:
        raise DetectionDataError(f"{root}: no COCO annotation file (*.json)")
    path = files[0]
    coco = _load(path)
    index, names = _categories(coco, path)
    images = _images(coco, path, root, skipped, folders)
    boxes: dict[Any, list[list[float]]] = {k: [] for k in images}
    fix = "each annotation needs image_id, category_id and bbox [x, y, width, height]"
    for i, a in enumerate(coco["annotations"]):
        where = _entry(a, "annotation", i, ("image_id", "category_id", "bbox"), path, fix)
        if a.get("iscrowd", 0):
            continue
        if not isinstance(a["image_id"], (int, str)) or a["image_id"] not in images:
            raise DetectionDataError(f"{where}: image_id {a['image_id']!r} is not among the "
                                     "images: add the image or drop the annotation")
        cat = a["category_id"]
        if isinstance(cat, bool) or not isinstance(cat, (int, str)) or cat not in index:
            known = ", ".join(str(k) for k in list(index)[:8]) + (" ..." if len(index) > 8 else "")
            raise DetectionDataError(f"{where}: category_id {cat!r} is not among the categories "
                                     f"(ids {known}): add it to 'categories' or fix the "
                                     "annotation")
        x, y, w, h = _box(a, where)
        image = images[a["image_id"]]
        if image is None:
            continue  # an unreadable image, skipped (and counted) already
        if w == 0 or h == 0:
            skipped.add("box of zero width or height", where, "box left out")
            continue
        clipped = clip_box([x, y, x + w, y + h], image[1], image[2])
        if clipped is None:
            skipped.add("box entirely outside its image", where, "box left out")
            continue
        boxes[a["image_id"]].append([index[cat], *clipped])
    records = []
    keys = sorted(images) if all(isinstance(k, int) for k in images) else list(images)
    for key in keys:
        image = images[key]
        if image is None:
            continue
        if not boxes[key]:
            skipped.add("image without annotations", f"{path}: image id {key} ({image[0].name})",
                        "used as background")
        records.append((image[0], np.asarray(boxes[key], dtype=np.float32).reshape(-1, 5)))
    return records, names

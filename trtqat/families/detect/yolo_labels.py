"""YOLO label files: one ``.txt`` per image, a line per object: ``class cx cy w h``
normalised to [0, 1] by the image's width and height.

Each defect is one line naming ``FILE:LINE`` and the fix: not numbers, a class that is not
an integer >= 0 or not among the names, coordinates outside [0, 1] (to
:data:`TOLERANCE`), a negative width or height, a non-finite value, a column count that is
neither a box nor a polygon. A polygon line (Ultralytics' segmentation labels: ``class x1
y1 x2 y2 x3 y3 ...``, an even count of at least 6 coordinates) is read as its bounding box,
as Ultralytics does when it trains a detector on them, with one NOTE. Skipped with one
warning per kind (errors under ``--strict``): unreadable images, boxes of zero width or
height, images without boxes (an empty or missing label file: kept as background).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from trtqat.families.detect.data_checks import (
    DetectionDataError,
    Skipped,
    clip_box,
    finite,
    image_size,
    read_text,
)

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
TOLERANCE = 1e-3  # normalised coordinates may overshoot [0, 1] by this much (rounding)
Record = tuple[Path, np.ndarray]
LINE_FORMS = ("a box is 'class cx cy w h' (5 columns), a polygon 'class x1 y1 x2 y2 x3 y3 "
              "...' (an even count of at least 6 coordinates)")


def images_in(folder: Path) -> list[Path]:
    """The image files under ``folder`` (by suffix), sorted."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                  and p.is_file())


def labels_folder(images: Path) -> Path:
    """Where the labels of the images in ``images`` are: its last ``images`` part replaced
    by ``labels`` (``images/train`` -> ``labels/train``, Ultralytics' rule), or ``images``
    itself when no part is so named (labels beside their images)."""
    parts = list(images.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts)
    return images


def pairs(folder: Path) -> list[tuple[Path, Path]]:
    """``(image, label file)`` of every image under ``folder``."""
    labels = labels_folder(folder)
    return [(p, labels / p.relative_to(folder).with_suffix(".txt")) for p in images_in(folder)]


class Names:
    """The class names a label may use (``source``: where they come from, for messages),
    or none given: any class index >= 0, named by its number."""

    def __init__(self, names: list[str] | None = None, source: str = "") -> None:
        self.names, self.source = names, source

    def check(self, cls: int, where: str) -> None:
        """Refuse a class index outside the given names."""
        if self.names is not None and cls >= len(self.names):
            raise DetectionDataError(
                f"{where}: class {cls}, but {self.source} names {len(self.names)} class(es) "
                f"(0..{len(self.names) - 1}): add the missing names to {self.source} or fix "
                "the label")


def _parse(line: str, where: str, names: Names) -> tuple[int, list[float], bool]:
    """The line's class, ``[cx, cy, w, h]`` (normalised) and whether it was a polygon."""
    parts = line.split()
    try:
        values = [float(v) for v in parts]
    except ValueError:
        values = []
    if len(values) < 5:
        raise DetectionDataError(f"{where}: expected 'class cx cy w h' (numbers), got "
                                 f"{line.strip()!r}")
    if not finite(values):
        raise DetectionDataError(f"{where}: a non-finite value in {line.strip()!r}: give "
                                 "finite numbers")
    c, coords = values[0], values[1:]
    if not c.is_integer() or c < 0:
        raise DetectionDataError(f"{where}: class {parts[0]!r} is not a class index: give an "
                                 "integer 0, 1, ... (the line number of its name)")
    names.check(int(c), where)
    polygon = len(coords) != 4
    if polygon and (len(coords) % 2 or len(coords) < 6):
        raise DetectionDataError(f"{where}: {len(parts)} columns: {LINE_FORMS}")
    if not polygon and (coords[2] < 0 or coords[3] < 0):
        raise DetectionDataError(f"{where}: negative width or height in {line.strip()!r}: "
                                 "give 'class cx cy w h' with w, h > 0")
    if not all(-TOLERANCE <= v <= 1 + TOLERANCE for v in coords):
        raise DetectionDataError(f"{where}: coordinates outside [0, 1] in {line.strip()!r}: "
                                 "YOLO labels are normalised, divide pixel values by the image "
                                 "width and height")
    if polygon:
        xs, ys = coords[0::2], coords[1::2]
        x1, x2, y1, y2 = min(xs), max(xs), min(ys), max(ys)
        coords = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
    return int(c), coords, polygon


def _read(label: Path, width: int, height: int, names: Names, skipped: Skipped
          ) -> tuple[list[list[float]], int]:
    """The label file's boxes in pixels (class, x1, y1, x2, y2) and its polygon count."""
    text = read_text(label, "give a text file of 'class cx cy w h' lines")
    rows, polygons = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{label}:{n}"
        c, (cx, cy, w, h), polygon = _parse(line, where, names)
        polygons += polygon
        if w <= 0 or h <= 0:
            skipped.add("box of zero width or height", where, "box left out")
            continue
        box = clip_box([(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width,
                        (cy + h / 2) * height], width, height)
        if box is None:
            skipped.add("box entirely outside its image", where, "box left out")
            continue
        rows.append([float(c), *box])
    return rows, polygons


def yolo_records(items: Iterable[tuple[Path, Path]], names: Names, skipped: Skipped
                 ) -> tuple[list[Record], int]:
    """The readable images of ``items`` (image, label file) with their checked boxes (class,
    x1, y1, x2, y2 in the image's pixels), and the largest class index used (-1: none)."""
    records, top, polygons, first = [], -1, 0, None
    for path, label in items:
        size = image_size(path, skipped)
        if size is None:
            continue
        rows: list[list[float]] = []
        if label.is_file():
            rows, count = _read(label, *size, names, skipped)
            if count and first is None:
                first = label
            polygons += count
        if not rows:
            skipped.add("image without boxes (empty or missing label file)", str(label),
                        "used as background")
        t = np.asarray(rows, dtype=np.float32).reshape(-1, 5)
        top = max(top, int(t[:, 0].max(initial=-1)))
        records.append((path, t))
    if polygons:
        log.warning("NOTE %d polygon (segmentation) label line(s), e.g. in %s, read as their "
                    "bounding boxes", polygons, first)
    return records, top

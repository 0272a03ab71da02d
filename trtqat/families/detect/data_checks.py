"""What the detection data readers share: their error, skippable defects counted into one
warning line each (errors under ``--strict``), image headers, and image paths kept inside
the dataset folder."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path, PurePath

from trtqat.errors import TrtqatError

log = logging.getLogger(__name__)


class DetectionDataError(TrtqatError, ValueError):
    """Detection data that cannot be read (no images, no boxes, bad annotation file)."""


class Skipped:
    """Skippable defects of one dataset (an unreadable image, a box outside its image, an
    image without boxes), counted by kind: :meth:`report` logs one warning per kind with
    its count and first example. ``strict`` makes the first one an error."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.kinds: dict[str, tuple[int, str, str]] = {}  # kind: count, first where, outcome

    def add(self, kind: str, where: str, outcome: str) -> None:
        """One defect of ``kind`` at ``where``; ``outcome``: what happens to it unstrict."""
        if self.strict:
            raise DetectionDataError(f"{where}: {kind}: fix it, or drop --strict to go on with "
                                     f"a warning ({outcome})")
        count, first, _ = self.kinds.get(kind, (0, where, outcome))
        self.kinds[kind] = (count + 1, first, outcome)

    def report(self, folder: Path | str) -> None:
        """One warning line per kind of defect found in ``folder``."""
        for kind, (count, first, outcome) in self.kinds.items():
            log.warning("%s: %d x %s: %s (e.g. %s); --strict refuses them", folder, count,
                        kind, outcome, first)


def image_size(path: Path, skipped: Skipped) -> tuple[int, int] | None:
    """``(width, height)`` from the image's header; None (counted as skipped) when it is
    not a readable image."""
    from trtqat.families.images import open_image

    try:
        with open_image(path) as im:
            width, height = im.size
    except Exception:  # PIL raises many kinds for a file that is not an image
        skipped.add("unreadable image", str(path), "skipped")
        return None
    if width < 1 or height < 1:
        skipped.add("unreadable image", str(path), "skipped")
        return None
    return width, height


def inside(root: Path, name: str, where: str) -> Path:
    """``root / name``, refused when ``name`` is absolute or leaves ``root`` through
    ``..`` (symbolic links inside the folder are followed: image stores are often linked)."""
    if PurePath(name).is_absolute() or os.path.isabs(name) or PurePath(name).drive:
        raise DetectionDataError(f"{where}: image path {name!r} is absolute: give it relative "
                                 f"to the dataset folder {root}")
    base = os.path.normpath(os.path.abspath(root))
    full = os.path.normpath(os.path.join(base, name))
    if os.path.commonpath([base, full]) != base:
        raise DetectionDataError(f"{where}: image path {name!r} leaves the dataset folder "
                                 f"{root}: put the image inside it and give its path relative "
                                 "to it")
    return Path(full)


def read_text(path: Path, fix: str) -> str:
    """The text of ``path`` (a UTF-8 byte-order mark dropped); one line naming it and
    ``fix`` when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DetectionDataError(f"{path}: cannot read it ({type(exc).__name__}): {fix}"
                                 ) from None


def finite(values: list[float]) -> bool:
    """True when every value is a finite number."""
    return all(math.isfinite(v) for v in values)


def clip_box(box: list[float], width: int, height: int) -> list[float] | None:
    """``[x1, y1, x2, y2]`` clipped to the image; None when nothing of it lies inside."""
    x1, y1, x2, y2 = (max(0.0, min(float(width), box[0])), max(0.0, min(float(height), box[1])),
                      max(0.0, min(float(width), box[2])), max(0.0, min(float(height), box[3])))
    if x2 <= x1 or y2 <= y1:
        return None
    return [x1, y1, x2, y2]


def check_boxes(count: int, where: str, fix: str) -> None:
    """A split left with no usable box is an error."""
    if count == 0:
        raise DetectionDataError(f"no usable boxes: {where}; {fix}")

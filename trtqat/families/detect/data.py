"""Detection data: the embedded digits canvases, a COCO-format folder, a YOLO-format folder.

Every sample is ``(image, targets)``: a float32 ``(3, H, W)`` image in [0, 1] (no mean/std:
YOLO models normalise by 255 alone) and a float32 ``(n, 5)`` array of class, x1, y1, x2, y2
in pixels of that image. Folder images are resized to the run's size (boxes scaled along).

``--data``:

* ``digits`` (default): :mod:`.digits`, 2000 training and 300 validation canvases;
* a COCO folder: one ``*.json`` with ``images``, ``annotations`` and ``categories`` beside the
  images (or beside an ``images/`` folder);
* a YOLO folder: ``images/`` and ``labels/`` (one ``.txt`` per image: ``class cx cy w h``,
  normalised);
* a folder holding ``train/`` and ``val/`` of either format; otherwise the images are split
  80/20 (the same way every time).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from trtqat.errors import TrtqatError
from trtqat.sizes import hw

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
SPLIT_SEED = 0


class DetectionDataError(TrtqatError, ValueError):
    """Detection data that cannot be read (no images, no boxes, bad annotation file)."""


def _load_image(path: Path, size: tuple[int, int]) -> tuple[torch.Tensor, float, float]:
    """The image resized to ``size`` (h, w), and the x and y scale factors."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            rgb = im.convert("RGB")
            sx, sy = size[1] / rgb.width, size[0] / rgb.height
            rgb = rgb.resize((size[1], size[0]), Image.BILINEAR)
            arr = np.asarray(rgb, dtype=np.float32) / 255.0
    except OSError as exc:
        raise DetectionDataError(f"cannot read image {path}: {exc}") from None
    return torch.from_numpy(arr.transpose(2, 0, 1).copy()), sx, sy


class FolderDetection(Dataset):
    """Images and their pixel boxes (``records``: path and ``(n, 5)`` targets in the
    image's own pixels), resized to ``size``."""

    def __init__(self, records: list[tuple[Path, np.ndarray]], classes: list[str],
                 size: int | tuple[int, int]) -> None:
        self.records, self.classes, self.size = records, classes, hw(size)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, targets = self.records[index]
        image, sx, sy = _load_image(path, self.size)
        t = targets.copy()
        t[:, [1, 3]] *= sx
        t[:, [2, 4]] *= sy
        return image, torch.from_numpy(t)


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def _coco_records(root: Path) -> tuple[list[tuple[Path, np.ndarray]], list[str]]:
    files = sorted(root.glob("*.json")) + sorted((root / "annotations").glob("*.json"))
    if not files:
        raise DetectionDataError(f"{root}: no COCO annotation file (*.json)")
    try:
        coco = json.loads(files[0].read_text())
        cats = sorted(coco["categories"], key=lambda c: c["id"])
        images = {im["id"]: im for im in coco["images"]}
        anns = coco["annotations"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DetectionDataError(f"{files[0]} is not a COCO detection file (images, "
                                 f"annotations, categories): {exc}") from None
    index = {c["id"]: i for i, c in enumerate(cats)}
    boxes: dict[int, list[list[float]]] = {k: [] for k in images}
    for a in anns:
        if a.get("iscrowd", 0) or a.get("image_id") not in boxes:
            continue
        x, y, w, h = a["bbox"]
        if w > 0 and h > 0 and a["category_id"] in index:
            boxes[a["image_id"]].append([index[a["category_id"]], x, y, x + w, y + h])
    records = []
    for key, im in sorted(images.items()):
        path = next((p for p in (root / im["file_name"], root / "images" / im["file_name"],
                                 files[0].parent / im["file_name"]) if p.is_file()), None)
        if path is None:
            raise DetectionDataError(f"{files[0]}: image {im['file_name']} not found in {root}")
        records.append((path, np.asarray(boxes[key], dtype=np.float32).reshape(-1, 5)))
    return records, [str(c.get("name", c["id"])) for c in cats]


def _yolo_records(root: Path) -> tuple[list[tuple[Path, np.ndarray]], list[str]]:
    from PIL import Image

    records, top = [], -1
    for path in _images(root / "images"):
        label = root / "labels" / path.relative_to(root / "images").with_suffix(".txt")
        rows = []
        if label.is_file():
            for n, line in enumerate(label.read_text().splitlines(), 1):
                parts = line.split()
                if not parts:
                    continue
                try:
                    c, cx, cy, w, h = (float(v) for v in parts[:5])
                except ValueError:
                    raise DetectionDataError(f"{label}:{n}: expected 'class cx cy w h', got "
                                             f"{line.strip()!r}") from None
                rows.append((c, cx, cy, w, h))
        with Image.open(path) as im:
            width, height = im.size
        t = np.asarray(rows, dtype=np.float32).reshape(-1, 5)
        boxes = np.stack([t[:, 0], (t[:, 1] - t[:, 3] / 2) * width,
                          (t[:, 2] - t[:, 4] / 2) * height, (t[:, 1] + t[:, 3] / 2) * width,
                          (t[:, 2] + t[:, 4] / 2) * height], 1)
        top = max(top, int(t[:, 0].max(initial=-1)))
        records.append((path, boxes.astype(np.float32)))
    names = root / "classes.txt"
    classes = (names.read_text().split() if names.is_file()
               else [str(i) for i in range(top + 1)])
    return records, classes


def data_format(root: Path) -> str:
    """``coco`` or ``yolo`` (:class:`DetectionDataError` for anything else)."""
    if (root / "images").is_dir() and (root / "labels").is_dir():
        return "yolo"
    if any(root.glob("*.json")) or any((root / "annotations").glob("*.json")):
        return "coco"
    raise DetectionDataError(f"--data {root}: not a detection folder; give a COCO folder "
                             "(images + an annotations .json) or a YOLO folder (images/ and "
                             "labels/), or a folder with train/ and val/ of either, or digits")


def _records(root: Path):
    records, classes = (_yolo_records if data_format(root) == "yolo" else _coco_records)(root)
    if not records:
        raise DetectionDataError(f"--data {root}: no images found")
    return records, classes


def datasets(data: str | None, size: int | tuple[int, int]
             ) -> tuple[Dataset, Dataset, list[str]]:
    """``(train, val, class names)`` of ``--data`` at ``size``."""
    from trtqat.families.detect.digits import DigitsDetection

    if data in (None, "digits"):
        h, w = hw(size)
        if h != w:
            raise DetectionDataError("the digits detection data is square: give --image-size N")
        return DigitsDetection("train", h), DigitsDetection("val", h), list(
            DigitsDetection.classes)
    root = Path(data).expanduser()
    if not root.is_dir():
        raise DetectionDataError(f"--data {data}: no such folder (digits, or a COCO/YOLO "
                                 "folder)")
    if (root / "train").is_dir() and (root / "val").is_dir():
        train, classes = _records(root / "train")
        val, val_classes = _records(root / "val")
        classes = classes if len(classes) >= len(val_classes) else val_classes
        return (FolderDetection(train, classes, size), FolderDetection(val, classes, size),
                classes)
    records, classes = _records(root)
    if len(records) < 2:
        raise DetectionDataError(f"--data {data}: {len(records)} image(s); a train/val split "
                                 "needs at least 2")
    full = FolderDetection(records, classes, size)
    order = np.random.RandomState(SPLIT_SEED).permutation(len(records)).tolist()
    cut = max(1, min(len(order) - 1, int(round(0.8 * len(order)))))
    return Subset(full, order[:cut]), Subset(full, order[cut:]), classes


def collate(batch: Sequence[tuple[torch.Tensor, torch.Tensor]]
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Images stacked; targets kept per image (their counts differ)."""
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


def loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int = 0,
           workers: int = 0) -> DataLoader:
    """A loader of ``(images, [targets])`` batches (shuffled from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate,
                      num_workers=workers, generator=gen, drop_last=False)

"""Detection data: the embedded digits canvases, or COCO and YOLO datasets on disk.

Every sample is ``(image, targets)``: a float32 ``(3, H, W)`` image in [0, 1] (no mean/std:
YOLO models normalise by 255 alone) and a float32 ``(n, 5)`` array of class, x1, y1, x2, y2
in pixels of that image. Folder images are resized to the run's size (boxes scaled along).

``--data``:

* ``digits`` (default): :mod:`.digits`, 2000 training and 300 validation canvases;
* a dataset on disk (:mod:`.data_layouts`): an Ultralytics ``data.yaml`` or the folder of
  one, Ultralytics' ``images/{train,val}`` + ``labels/{train,val}``, a COCO folder (one
  ``*.json`` with ``images``, ``annotations`` and ``categories``), a YOLO folder
  (``images/`` and ``labels/``), or a folder holding ``train/`` and ``val/`` of either;
  without a validation split the images are split 80/20 (the same way every time).

Every file is checked before anything trains (:mod:`.coco_data`, :mod:`.yolo_labels`):
defects are one line naming the file and the fix; skippable ones (unreadable images, boxes
outside their image, images without boxes) one warning per kind, errors with ``strict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from trtqat.families.detect.data_checks import DetectionDataError
from trtqat.families.detect.data_layouts import data_format, find_splits
from trtqat.families.detect.yolo_labels import IMAGE_SUFFIXES
from trtqat.sizes import hw

__all__ = ["DetectionDataError", "FolderDetection", "IMAGE_SUFFIXES", "collate", "data_format",
           "datasets", "loader"]

SPLIT_SEED = 0


def _load_image(path: Path, size: tuple[int, int]) -> tuple[torch.Tensor, float, float]:
    """The image resized to ``size`` (h, w), and the x and y scale factors."""
    from PIL import Image

    from trtqat.families.images import open_image

    try:
        with open_image(path) as im:
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


def datasets(data: str | None, size: int | tuple[int, int], strict: bool = False
             ) -> tuple[Dataset, Dataset, list[str]]:
    """``(train, val, class names)`` of ``--data`` at ``size``; ``strict``: a skippable
    defect (an unreadable image, a box outside its image, an image without boxes) is an
    error instead of a warning."""
    from trtqat.families.detect.digits import DigitsDetection

    if data in (None, "digits"):
        h, w = hw(size)
        if h != w:
            raise DetectionDataError("the digits detection data is square: give --image-size N")
        return DigitsDetection("train", h), DigitsDetection("val", h), list(
            DigitsDetection.classes)
    splits = find_splits(str(data), strict)
    classes = splits.classes
    if splits.val is not None:
        return (FolderDetection(splits.train, classes, size),
                FolderDetection(splits.val, classes, size), classes)
    records = splits.train
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
    """A loader of ``(images, [targets])`` batches (shuffled from ``seed``). A shuffled
    (training) loader drops a last batch of one image, which BatchNorm cannot train on."""
    gen = torch.Generator().manual_seed(seed)
    lone = shuffle and len(dataset) % batch_size == 1 and len(dataset) > 1
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate,
                      num_workers=workers, generator=gen, drop_last=lone)

"""The embedded detection data: scikit-learn's 8x8 digits composited onto canvases.

Each canvas holds 1-4 digits of random size, colour and place (never overlapping) on a dark,
noisy background, and the box of each digit is known exactly (the tight box of its pixels).
Everything follows from a seed and the sample's index, so a split is the same in every
stage and every run; the digits of the validation canvases are never in the training ones
(the 8x8 images are split first, 80/20).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

DATA_SEED = 0  # the digit split and every canvas (the same in every stage and run)
TRAIN_IMAGES = 1600
VAL_IMAGES = 300
MAX_DIGITS = 4
CLASSES = [str(i) for i in range(10)]


@functools.cache
def _digit_pool(split: str) -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 digit images (float in [0, 1]) and labels of one split (80/20)."""
    from trtqat.optional import require

    bunch = require("sklearn.datasets", "demo", "the digits detection data").load_digits()
    images = bunch.images.astype(np.float32) / 16.0
    order = np.random.RandomState(DATA_SEED).permutation(len(images))
    cut = int(0.8 * len(order))
    idx = order[:cut] if split == "train" else order[cut:]
    return images[idx], bunch.target[idx].astype(np.int64)


def _overlaps(box: np.ndarray, boxes: list[np.ndarray], margin: float) -> bool:
    for b in boxes:
        if (box[0] < b[2] + margin and b[0] < box[2] + margin and box[1] < b[3] + margin
                and b[1] < box[3] + margin):
            return True
    return False


def make_canvas(rng: np.random.RandomState, size: int, pool: tuple[np.ndarray, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """One canvas ``(3, size, size)`` float32 in [0, 1] and its targets ``(n, 5)``: class,
    x1, y1, x2, y2 in pixels."""
    images, labels = pool
    background = rng.uniform(0.0, 0.25, size=(3, 1, 1)).astype(np.float32)
    canvas = background + rng.normal(0.0, 0.03, size=(3, size, size)).astype(np.float32)
    boxes: list[np.ndarray] = []
    targets = []
    for _ in range(rng.randint(1, MAX_DIGITS + 1)):
        side = int(rng.uniform(size / 5.5, size / 2.5))
        height = side
        width = max(6, int(side * rng.uniform(0.75, 1.1)))
        k = rng.randint(len(images))
        digit = F.interpolate(torch.from_numpy(images[k])[None, None], size=(height, width),
                              mode="bilinear", align_corners=False)[0, 0].clamp(0, 1).numpy()
        ys, xs = np.nonzero(digit > 0.15)
        if len(ys) == 0:
            continue
        for _ in range(20):  # a free place
            x0, y0 = rng.randint(0, size - width + 1), rng.randint(0, size - height + 1)
            box = np.array([x0 + xs.min(), y0 + ys.min(), x0 + xs.max() + 1, y0 + ys.max() + 1],
                           dtype=np.float32)
            if not _overlaps(box, boxes, 2.0):
                break
        else:
            continue
        colour = rng.uniform(0.55, 1.0, size=(3, 1, 1)).astype(np.float32)
        patch = canvas[:, y0:y0 + height, x0:x0 + width]
        canvas[:, y0:y0 + height, x0:x0 + width] = patch * (1 - digit) + colour * digit
        boxes.append(box)
        targets.append([float(labels[k]), *box.tolist()])
    return (np.clip(canvas, 0.0, 1.0),
            np.asarray(targets, dtype=np.float32).reshape(-1, 5))


class DigitsDetection(Dataset):
    """``split`` ("train" or "val") canvases of ``size`` pixels: ``(image, targets)``."""

    classes = CLASSES

    def __init__(self, split: str, size: int, count: int | None = None) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"unknown split {split!r}")
        self.split, self.size = split, int(size)
        self.count = count or (TRAIN_IMAGES if split == "train" else VAL_IMAGES)
        self.pool = _digit_pool(split)
        self.offset = 0 if split == "train" else 10_000_000

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.RandomState((DATA_SEED * 1_000_003 + self.offset + index) % (2 ** 32))
        image, targets = make_canvas(rng, self.size, self.pool)
        return torch.from_numpy(image), torch.from_numpy(targets)

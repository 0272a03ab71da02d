"""Data for the recipes: scikit-learn's digits, an ImageFolder on disk, or synthetic images
(flat image folders and arrays for calibration: :mod:`trtqat.families.cnn.data_sources`).

``make_loaders`` is the one entry point: it returns ``(train_loader, val_loader,
num_classes)``. The train loader shuffles (per epoch, reproducibly from ``seed``) and
augments; the val loader uses deterministic eval transforms and never shuffles. Under
torch.distributed each rank sees its own shard of both.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset
from torchvision.transforms import v2

from trtqat.families.cnn.data_sources import (  # noqa: F401  (IMAGENET_*, DataError, list_images re-exported from here)
    IMAGENET_MEAN,
    IMAGENET_STD,
    DataError,
    FlatImageFolder,
    Preprocess,
    _readable_images,
    _report_unreadable,
    array_dataset,
    check_image_memory,
    data_kind,
    hw,
    list_images,
    make_preprocess,
)

log = logging.getLogger(__name__)

BUILTIN = ("digits", "synthetic")
DIGITS_VAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # the digits split is fixed, whatever --seed says
DIGITS_IMAGES = 1797  # scikit-learn's digits, all held in memory at the chosen size
SYNTHETIC_SIZES = (1024, 256)  # train, val


# --------------------------------------------------------------------------- samplers
class EpochShuffleSampler(Sampler[int]):
    """Shuffles with a generator seeded by ``seed + epoch``: a resumed run sees the same order."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch``."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class ShardSampler(Sampler[int]):
    """Every ``world_size``-th index from ``rank``, in order and without padding (exact eval)."""

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, n, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


# --------------------------------------------------------------------------- datasets
class TransformDataset(Dataset):
    """A ``TensorDataset`` of (image, label) with a per-sample transform on the image."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.images[i]
        return (self.transform(x) if self.transform else x), int(self.labels[i])


def _digits(size: tuple[int, int], channels: int, augment: bool
            ) -> tuple[Dataset, Dataset, int]:
    from trtqat.optional import require

    load_digits = require("sklearn.datasets", "demo", "the digits data set").load_digits
    train_test_split = require("sklearn.model_selection", "demo",
                               "the digits data set").train_test_split

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # N,1,8,8 in [0,1]
    y = torch.tensor(bunch.target, dtype=torch.long)
    idx = torch.arange(len(y)).numpy()
    tr, va = train_test_split(idx, test_size=DIGITS_VAL_FRACTION, stratify=y.numpy(),
                              random_state=DIGITS_SPLIT_SEED)
    x = torch.nn.functional.interpolate(x, size=size, mode="bilinear",
                                        align_corners=False).clamp_(0, 1).expand(-1, channels, -1, -1)
    mean, std = x[tr].mean().item(), x[tr].std().item()
    x = ((x - mean) / std).contiguous()
    pad = max(1, min(size) // 8)
    # Digits are not mirror-symmetric: shift and slightly rotate/scale, never flip.
    train_tf = v2.Compose([
        v2.RandomCrop(size, padding=pad, fill=-mean / std),
        v2.RandomAffine(degrees=10, scale=(0.9, 1.1), fill=-mean / std),
    ])
    tr, va = torch.as_tensor(tr), torch.as_tensor(va)
    train = TransformDataset(x[tr], y[tr], train_tf if augment else None)
    val = TransformDataset(x[va], y[va])
    train.classes = val.classes = [str(c) for c in range(10)]
    return train, val, 10


def _synthetic(size: tuple[int, int], channels: int, num_classes: int, seed: int
               ) -> tuple[Dataset, Dataset, int]:
    """Class-dependent patterns plus noise: learnable, so loss goes down, and instant."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(num_classes, channels, *size, generator=g)
    sets = []
    for n in SYNTHETIC_SIZES:
        y = torch.randint(0, num_classes, (n,), generator=g)
        x = protos[y] + torch.randn(n, channels, *size, generator=g)
        sets.append(TensorDataset(x, y))
    return sets[0], sets[1], num_classes










def _scan_split(root: Path, split: str, strict: bool):
    folder = root / split
    classes = sorted(d.name for d in os.scandir(folder) if d.is_dir())
    if not classes:
        raise DataError(f"{folder} holds no class folders: put images in {folder}/<class>/")
    samples, bad, empty = [], [], []
    for ci, cls in enumerate(classes):
        good, unreadable = _readable_images(folder / cls)
        samples += [(str(p), ci) for p in good]
        bad += unreadable
        if not good:
            empty.append(cls)
    _report_unreadable(bad, folder, strict)
    if empty:
        raise DataError(f"class folder(s) with no readable image in {folder}: "
                        f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}")
    return classes, samples, len(bad)


def _image_folder(root: Path, prep: Preprocess, strict: bool, augment: bool
                  ) -> tuple[Dataset, Dataset, int]:
    from torchvision.datasets import ImageFolder

    if not root.is_dir():
        what = "is a file, not a folder" if root.is_file() else "no such folder"
        raise DataError(f"--data {root}: {what}; use 'digits', 'synthetic' or an ImageFolder "
                        "path with train/ and val/ (calibration also takes a flat folder of "
                        f"images or a .npy/.npz){_detection_hint(root)}")
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise DataError(f"{root} has no {split}/ folder: training and evaluation need "
                            f"labels, {root}/train/<class>/*.jpg and {root}/val/<class>/*.jpg "
                            "(a flat folder of images or a .npy/.npz serves calibration only)"
                            f"{_detection_hint(root)}")
    tr_classes, tr_samples, _ = _scan_split(root, "train", strict)
    va_classes, va_samples, _ = _scan_split(root, "val", strict)
    if tr_classes != va_classes:
        raise DataError(f"{root}/train and {root}/val have different class folders "
                        f"({len(tr_classes)} vs {len(va_classes)}): they must match")
    if len(tr_classes) < 2:
        raise DataError(f"{root}/train has {len(tr_classes)} class folder ({tr_classes[0]}): a "
                        "classifier needs at least 2, one sub-folder per class")
    eval_tf = prep.eval_transform()
    train_tf = prep.train_transform() if augment else eval_tf
    out = []
    for split, samples, tf in (("train", tr_samples, train_tf), ("val", va_samples, eval_tf)):
        ds = ImageFolder(str(root / split), transform=tf)
        ds.samples = ds.imgs = samples  # only the images that opened
        ds.targets = [c for _, c in samples]
        out.append(ds)
    return out[0], out[1], len(tr_classes)


def _detection_hint(root: Path) -> str:
    """A pointer to the detector family when ``root`` looks like detection data (a dataset
    yaml, or images/ beside labels/), else ''."""
    if root.suffix.lower() in (".yaml", ".yml") or (root / "data.yaml").is_file() or (
            (root / "images").is_dir() and (root / "labels").is_dir()):
        return ("; it looks like detection data (images/ and labels/ or a data.yaml): for a "
                "detector pass --model detect:FILE.py:FACTORY, yolo_digits or an Ultralytics "
                ".yaml/.pt")
    return ""


def make_datasets(data: str = "digits", image_size: int | tuple[int, int] = 32, seed: int = 0,
                  *, num_classes: int | None = None, strict: bool = False, augment: bool = True,
                  prep: Preprocess | None = None) -> tuple[Dataset, Dataset, int]:
    """(train, val, num_classes) datasets; raises :class:`DataError` on bad input.

    ``augment=False`` gives the train images with eval transforms (for calibration).
    ``prep`` (resize, crop, mean/std, channels) defaults to ImageNet statistics at
    ``image_size`` (an int or ``(height, width)``).
    """
    prep = prep or make_preprocess(image_size)
    if min(hw(image_size)) < 8:
        raise DataError(f"--image-size must be >= 8, got {image_size}")
    if data == "digits":
        check_image_memory(image_size, prep.channels, DIGITS_IMAGES, "the digits images")
        return _digits(hw(image_size), prep.channels, augment)
    if data == "synthetic":
        return _synthetic(hw(image_size), prep.channels, num_classes or 10, seed)
    from trtqat.families.cnn.data_sources import data_kind

    if data_kind(data) in ("flat", "array"):
        raise DataError(f"--data {data} has no labels: training and evaluation need an "
                        "ImageFolder (train/<class>/, val/<class>/), digits or synthetic; "
                        "flat image folders and .npy/.npz serve calibration only")
    return _image_folder(Path(data), prep, strict, augment)


def _dist_info(distributed: bool) -> tuple[int, int]:
    if not distributed:
        return 0, 1
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def make_loader(dataset: Dataset, batch_size: int = 64, workers: int = 0, seed: int = 0,
                distributed: bool = False, train: bool = True, keep_last: bool = False
                ) -> DataLoader:
    """A loader over ``dataset``: seeded per-epoch shuffle (``train``) or fixed order.
    ``keep_last``: keep a final batch of one sample (calibration: no BatchNorm training).

    With ``distributed``, each rank reads its shard (a seeded ``DistributedSampler`` when
    ``train``, an unpadded strided shard otherwise, so evaluation counts every image once).
    """
    if batch_size < 1:
        raise DataError(f"--batch-size must be >= 1, got {batch_size}")
    if workers < 0:
        raise DataError(f"--workers must be >= 0, got {workers}")
    rank, world = _dist_info(distributed)
    if train and world > 1:
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=seed)
    elif train:
        sampler = EpochShuffleSampler(len(dataset), seed)
    else:
        sampler = ShardSampler(len(dataset), rank, world) if world > 1 else None
    # A final batch of one sample would break BatchNorm in training.
    per_rank = math.ceil(len(dataset) / world)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                      drop_last=train and not keep_last and per_rank % batch_size == 1,
                      num_workers=workers,
                      pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0)


def make_loaders(data: str = "digits", image_size: int | tuple[int, int] = 32,
                 batch_size: int = 64, workers: int = 0, seed: int = 0,
                 distributed: bool = False, *, num_classes: int | None = None,
                 strict: bool = False, prep: Preprocess | None = None
                 ) -> tuple[DataLoader, DataLoader, int]:
    """(train_loader, val_loader, num_classes) for ``data`` ('digits', 'synthetic' or a path).

    The val loader is deterministic (eval transforms, fixed order). With ``distributed``,
    both are sharded across ranks (train with a seeded ``DistributedSampler``).
    ``num_classes`` sets the class count of 'synthetic'; ``strict`` fails on unreadable
    ImageFolder files instead of skipping them.
    """
    if batch_size < 1:
        raise DataError(f"--batch-size must be >= 1, got {batch_size}")
    train, val, n_cls = make_datasets(data, image_size, seed, num_classes=num_classes,
                                      strict=strict, prep=prep)
    return (make_loader(train, batch_size, workers, seed, distributed, train=True),
            make_loader(val, batch_size, workers, seed, distributed, train=False), n_cls)


def calibration_datasets(data: str, prep: Preprocess, seed: int = 0, *,
                         num_classes: int | None = None, strict: bool = False
                         ) -> tuple[Dataset, Dataset | None, int | None, Preprocess]:
    """``(calibration set, validation set or None, classes or None, preprocessing)``.

    Flat folders and arrays have no labels, so no validation set; ImageFolder, digits and
    synthetic data give their train split (eval transforms) and their val split.
    """
    kind = data_kind(data)
    if kind == "array":
        ds, prep = array_dataset(data, prep)
        return ds, None, None, prep
    if kind == "flat":
        return FlatImageFolder(data, prep, strict), None, None, prep
    from trtqat.families.cnn.data import make_datasets

    train, val, classes = make_datasets(data, prep.image_size, seed, num_classes=num_classes,
                                        strict=strict, augment=False, prep=prep)
    return train, val, classes, prep

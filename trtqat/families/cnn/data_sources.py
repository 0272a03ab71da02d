"""Data from anywhere: preprocessing options, flat image folders and ``.npy``/``.npz`` tensors.

- :class:`Preprocess`: input size (square or ``HxW``), resize, center crop, mean/std and
  channels, recorded in ``args.yaml`` and in the checkpoint's ``model.preprocess``.
- A *flat folder* (images directly inside, no labels) and an *array file* (``(N, C, H, W)``
  floats, already preprocessed) serve calibration only; training and evaluation need labels
  (an ImageFolder with ``train/`` and ``val/``, ``digits`` or ``synthetic``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from trtqat.arrays import is_array_spec, load_array
from trtqat.errors import TrtqatError
from trtqat.sizes import (  # noqa: F401 (re-exported)
    DataSourceError,
    check_image_memory,
    hw,
    parse_size,
    size_text,
)

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_FRACTION = 0.875  # "auto" resize: the crop is 87.5% of the resized image (timm, torchvision)


def _floats(text: str | Sequence[float] | None, flag: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    if isinstance(text, str):
        try:
            return tuple(float(t) for t in text.split(",") if t.strip())
        except ValueError:
            raise DataSourceError(f"{flag} {text!r}: use comma-separated numbers, e.g. "
                                  "0.485,0.456,0.406") from None
    return tuple(float(t) for t in text)


class DataError(TrtqatError, ValueError):
    """The data set is missing, empty or unreadable."""


# --------------------------------------------------------------------------- preprocessing
class _ConvertMode:
    """PIL image -> ``mode`` (a class, not a lambda: loader workers may pickle it)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __call__(self, image):
        return image.convert(self.mode)


@dataclass(frozen=True)
class Preprocess:
    """How images become model inputs (eval): resize, center crop to ``size``, normalize."""

    size: tuple[int, int] = (32, 32)
    resize: tuple[int, int] | int | None = None  # None: shorter side to max(size)/0.875
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    channels: int = 3

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise DataSourceError(f"--channels must be 1 or 3, got {self.channels}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, self.channels):
                raise DataSourceError(f"--{name} has {len(values)} values for "
                                      f"{self.channels} channel(s): give 1 or {self.channels}")
        for name in ("mean", "std"):
            if not all(math.isfinite(v) for v in getattr(self, name)):
                raise DataSourceError(f"--{name} values must be finite numbers, got "
                                      f"{list(getattr(self, name))}")
        if any(s <= 0 for s in self.std):
            raise DataSourceError(f"--std values must be > 0, got {list(self.std)}")
        if min(self.size) < 1:
            raise DataSourceError(f"--image-size must be >= 1, got {size_text(self.size)}")
        check_image_memory(self.size, self.channels)
        if self.resize is not None:
            check_image_memory(self.resize, self.channels, what="one resized image",
                               flag="--resize")

    @property
    def image_size(self) -> int | tuple[int, int]:
        """The size as options write it: an int when square."""
        h, w = self.size
        return h if h == w else (h, w)

    def resize_to(self) -> int | tuple[int, int]:
        """The resize before the crop: the shorter side (int) or an exact ``(h, w)``."""
        if self.resize is None:
            return int(math.floor(max(self.size) / CROP_FRACTION))
        return self.resize

    def normalize(self) -> list:
        """ToDtype + Normalize transforms."""
        from torchvision.transforms import v2

        return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]

    def _to_tensor(self) -> list:
        from torchvision.transforms import v2

        return [_ConvertMode("L" if self.channels == 1 else "RGB"), v2.PILToTensor()]

    def eval_transform(self):
        """PIL image -> normalized ``(C, H, W)`` tensor: resize, center crop, normalize."""
        from torchvision.transforms import v2

        return v2.Compose([*self._to_tensor(), v2.Resize(self.resize_to(), antialias=True),
                           v2.CenterCrop(self.size), *self.normalize()])

    def train_transform(self):
        """Random resized crop and horizontal flip, then normalize."""
        from torchvision.transforms import v2

        return v2.Compose([*self._to_tensor(), v2.RandomResizedCrop(self.size, antialias=True),
                           v2.RandomHorizontalFlip(), *self.normalize()])

    def to_dict(self) -> dict[str, Any]:
        """Plain types for ``args.yaml`` and the checkpoint."""
        d = asdict(self)
        d["size"] = list(self.size)
        d["resize"] = list(self.resize) if isinstance(self.resize, tuple) else self.resize
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d


def make_preprocess(image_size: Any = None, resize: Any = None, mean: Any = None,
                    std: Any = None, channels: int | None = None,
                    recorded: dict[str, Any] | None = None, default_size: Any = 32
                    ) -> Preprocess:
    """A :class:`Preprocess` from options; ``None`` options come from ``recorded`` (a
    checkpoint's ``preprocess``), then from the defaults (ImageNet mean/std, 3 channels)."""
    rec = recorded or {}
    size = image_size if image_size is not None else rec.get("size") or default_size
    if resize is not None and str(resize).lower() == "auto":
        resize = None
    elif resize is None:
        resize = rec.get("resize")
    channels = int(channels if channels is not None else rec.get("channels") or 3)
    mean_t = _floats(mean, "--mean") or _floats(rec.get("mean"), "mean")
    std_t = _floats(std, "--std") or _floats(rec.get("std"), "std")
    if mean_t is None:
        mean_t = IMAGENET_MEAN if channels == 3 else (sum(IMAGENET_MEAN) / 3,)
    if std_t is None:
        std_t = IMAGENET_STD if channels == 3 else (sum(IMAGENET_STD) / 3,)
    rsz = None if resize is None else parse_size(resize, "--resize")
    return Preprocess(size=hw(parse_size(size)), resize=rsz, mean=mean_t, std=std_t,
                      channels=channels)


def preprocess_of(cfg: Any, recorded: dict[str, Any] | None = None,
                  default_size: Any = 32) -> Preprocess:
    """:func:`make_preprocess` from a config's ``image_size/resize/mean/std/channels``."""
    return make_preprocess(getattr(cfg, "image_size", None), getattr(cfg, "resize", None),
                           getattr(cfg, "mean", None), getattr(cfg, "std", None),
                           getattr(cfg, "channels", None), recorded, default_size)


# --------------------------------------------------------------------------- unlabelled data
class FlatImageFolder(Dataset):
    """Every readable image directly inside ``root`` (no labels): calibration images."""

    def __init__(self, root: str | Path, prep: Preprocess, strict: bool = False) -> None:
        self.root, self.prep = Path(root), prep
        self.files = list_images(self.root, strict, recursive=False)
        self.transform = prep.eval_transform()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        from trtqat.families.images import open_image

        with open_image(self.files[i]) as im:
            return self.transform(im)


def array_dataset(spec: str, prep: Preprocess) -> tuple[Dataset, Preprocess]:
    """An ``(N, C, H, W)`` float array as a dataset, and ``prep`` with the array's size."""
    from torch.utils.data import TensorDataset

    array = load_array(spec, ndim=4, what="calibration array (N, C, H, W)")
    if array.dtype.kind != "f":
        raise DataSourceError(f"{spec}: the array is {array.dtype}, expected floats "
                              "(preprocessed images, normalized as the model expects)")
    n, c, h, w = array.shape
    if n == 0:
        raise DataSourceError(f"{spec}: the array holds no images (shape {array.shape})")
    if c != prep.channels:
        raise DataSourceError(f"{spec}: shape {tuple(array.shape)} has {c} channel(s), the "
                              f"model takes {prep.channels}: pass --channels {c} or fix the "
                              "array (N, C, H, W)")
    x = torch.from_numpy(array.astype("float32", copy=False))
    prep = Preprocess(size=(h, w), resize=prep.resize, mean=prep.mean, std=prep.std,
                      channels=c)
    return TensorDataset(x), prep


def data_kind(data: str) -> str:
    """``digits``, ``synthetic``, ``array`` (.npy/.npz), ``flat`` (images only) or
    ``imagefolder`` (anything else: a folder with ``train/`` and ``val/``)."""
    if data in ("digits", "synthetic"):
        return data
    if is_array_spec(data):
        return "array"
    root = Path(data)
    if root.is_dir() and not (root / "train").is_dir():
        from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

        if any(p.is_file() and has_file_allowed_extension(p.name, IMG_EXTENSIONS)
               for p in root.iterdir()):
            return "flat"
    return "imagefolder"




def _is_readable(path: str) -> bool:
    from trtqat.families.images import open_image

    try:
        with open_image(path) as im:
            im.verify()
        return True
    except Exception:  # PIL raises many kinds for a broken file
        return False


def _readable_images(folder: Path, recursive: bool = True) -> tuple[list[Path], list[Path]]:
    """(readable, unreadable) image files in ``folder``, sorted."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

    found = folder.rglob("*") if recursive else folder.iterdir()
    files = sorted(p for p in found
                   if p.is_file() and has_file_allowed_extension(p.name, IMG_EXTENSIONS))
    ok = {p: _is_readable(str(p)) for p in files}
    return [p for p in files if ok[p]], [p for p in files if not ok[p]]


def _report_unreadable(bad: list[Path], folder: Path, strict: bool) -> None:
    if not bad:
        return
    if strict:
        raise DataError(f"{len(bad)} unreadable image(s) in {folder}, e.g. {bad[0]}: "
                        "fix or remove them, or drop --strict to skip them")
    log.warning("skipping %d unreadable image(s) in %s, e.g. %s", len(bad), folder, bad[0])


def list_images(folder: Path, strict: bool = False, recursive: bool = True) -> list[Path]:
    """The readable images in ``folder``; :class:`DataError` if there is none (or, with
    ``strict``, if any is unreadable)."""
    if not folder.is_dir():
        raise DataError(f"--data {folder}: no such folder")
    good, bad = _readable_images(folder, recursive)
    if not good:
        found = f" ({len(bad)} unreadable, e.g. {bad[0].name})" if bad else ""
        raise DataError(f"{folder} holds no images (.jpg, .png, ...){found}: put readable "
                        "calibration images directly in it")
    _report_unreadable(bad, folder, strict)
    return good

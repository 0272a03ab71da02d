"""A user's own model file, weights and image folders, as tiny as possible."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

MODEL_FILE = '''
from torch import nn


def make(num_classes=10):
    """A tiny CNN: conv-bn-relu, strided conv, global pool, linear."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def gray(num_classes=10):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, num_classes))


def not_a_model():
    return 3


def broken():
    raise RuntimeError("no GPU here")
'''


def write_model(folder: Path) -> Path:
    """``folder/my_net.py`` with the factories ``make``, ``gray``, ``not_a_model``, ``broken``."""
    path = folder / "my_net.py"
    path.write_text(MODEL_FILE)
    return path


def make_float(path: Path, factory: str = "make", **kwargs) -> torch.nn.Module:
    """Call a factory of the model file directly, as the user would."""
    spec = importlib.util.spec_from_file_location(f"byom_{factory}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, factory)(**kwargs)


def write_pngs(folder: Path, n: int, size: tuple[int, int] = (20, 24), seed: int = 0) -> Path:
    """``n`` random RGB PNGs directly in ``folder``."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        pixels = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i}.png")
    return folder


def write_image_folder(root: Path, classes: int = 2, per_class: int = 4) -> Path:
    """A labelled ImageFolder: ``root/{train,val}/c<k>/*.png``; class k is brighter."""
    from PIL import Image

    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"c{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                base = 40 + 160 * c
                pixels = np.clip(base + rng.integers(-30, 30, (20, 20, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    return root

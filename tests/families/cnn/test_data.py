"""Data: digits split and transforms, synthetic, ImageFolder checks, samplers."""

from __future__ import annotations

import logging

import pytest
import torch
from PIL import Image

from trtqat.families.cnn.data import DataError, EpochShuffleSampler, ShardSampler, make_loaders


def test_digits_loaders():
    train, val, n = make_loaders("digits", image_size=16, batch_size=64)
    assert n == 10 and len(train.dataset) == 1437 and len(val.dataset) == 360
    x, y = next(iter(train))
    assert x.shape == (64, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.long
    first = [b[0] for b in val]
    again = [b[0] for b in val]
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # deterministic val
    labels = torch.cat([b[1] for b in val])
    assert torch.bincount(labels).min() >= 34  # stratified: every digit ~36 times


def test_train_order_is_reproducible_per_epoch():
    s = EpochShuffleSampler(20, seed=3)
    s.set_epoch(1)
    a = list(s)
    s.set_epoch(2)
    b = list(s)
    s.set_epoch(1)
    assert list(s) == a and a != b and sorted(a) == list(range(20))


def test_shards_cover_every_image_once():
    shards = [list(ShardSampler(11, r, 3)) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(11))


def test_synthetic_uses_num_classes():
    train, val, n = make_loaders("synthetic", image_size=8, batch_size=16, num_classes=5)
    x, y = next(iter(train))
    assert n == 5 and x.shape == (16, 3, 8, 8) and int(y.max()) < 5


def _folder(root, classes=("cat", "dog"), per_class=2, splits=("train", "val")):
    for split in splits:
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (12, 10), (40 * i, 80, 120)).save(d / f"{i}.png")
    return root


def test_image_folder(tmp_path, caplog):
    root = _folder(tmp_path / "ds")
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"not an image")
    with caplog.at_level(logging.WARNING):
        train, val, n = make_loaders(str(root), image_size=8, batch_size=2)
    assert n == 2 and len(train.dataset) == 4 and len(val.dataset) == 4
    assert "skipping 1 unreadable image" in caplog.text
    x, _ = next(iter(val))
    assert x.shape == (2, 3, 8, 8)
    with pytest.raises(DataError, match="unreadable.*--strict"):
        make_loaders(str(root), image_size=8, strict=True)


@pytest.mark.parametrize("case, match", [
    ("no_val", "has no val/ folder"),
    ("empty_class", "no readable image.*dog"),
    ("missing", "no such folder"),
    ("file", r"is a file, not a folder.*flat folder of images or a \.npy/\.npz"),
])
def test_image_folder_errors(tmp_path, case, match):
    if case == "no_val":
        root = _folder(tmp_path / "ds", splits=("train",))
    elif case == "empty_class":
        root = _folder(tmp_path / "ds")
        for p in (root / "val" / "dog").iterdir():
            p.unlink()
    elif case == "file":
        root = tmp_path / "x.jpg"
        root.write_bytes(b"")
    else:
        root = tmp_path / "nope"
    with pytest.raises(DataError, match=match):
        make_loaders(str(root), image_size=8)

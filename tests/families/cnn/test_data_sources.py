"""Flat image folders, .npy/.npz arrays and preprocessing options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from byom_testlib import write_image_folder, write_model, write_pngs

from trtqat.arrays import load_array
from trtqat.errors import TrtqatError
from trtqat.families.cnn.data import calibration_datasets, make_datasets
from trtqat.families.cnn.data_sources import (
    data_kind,
    make_preprocess,
    parse_size,
)


@pytest.mark.parametrize("text, size", [("224", 224), ("224x160", (224, 160)),
                                        ("32x32", 32), ([24, 16], (24, 16))])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "a", "1x2x3", "-3x4"])
def test_parse_size_rejects(text):
    with pytest.raises(TrtqatError, match="--image-size"):
        parse_size(text)


def test_flat_folder_is_calibration_data_without_labels(tmp_path):
    flat = write_pngs(tmp_path / "flat", 3, size=(30, 20))
    (flat / "broken.jpg").write_bytes(b"not an image")
    prep = make_preprocess("16x12", mean="0.5", std="0.25", channels=1)
    assert data_kind(str(flat)) == "flat"
    calib, val, classes, _ = calibration_datasets(str(flat), prep)
    assert val is None and classes is None and len(calib) == 3  # the broken file is skipped
    x = calib[0]
    assert x.shape == (1, 16, 12) and x.dtype == torch.float32
    with pytest.raises(TrtqatError, match="unreadable image.*broken.jpg"):
        calibration_datasets(str(flat), prep, strict=True)
    with pytest.raises(TrtqatError, match="has no labels: training and evaluation need"):
        make_datasets(str(flat), 16)


def test_empty_and_missing_folders(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(TrtqatError, match="has no train/ folder"):
        calibration_datasets(str(tmp_path / "empty"), make_preprocess(16))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.png").write_bytes(b"broken")
    with pytest.raises(TrtqatError, match=r"holds no images \(.*\) \(1 unreadable, e.g. a.png\)"):
        calibration_datasets(str(bad), make_preprocess(16))


def test_image_folder_non_square_and_recorded_preprocessing(tmp_path):
    root = write_image_folder(tmp_path / "data")
    prep = make_preprocess("16x12", resize="20x12")
    train, val, classes = make_datasets(str(root), prep.image_size, augment=False, prep=prep)
    assert classes == 2 and train[0][0].shape == (3, 16, 12)
    again = make_preprocess(recorded=prep.to_dict())
    assert again == prep


def test_npy_and_npz_arrays(tmp_path):
    x = np.random.default_rng(0).standard_normal((5, 3, 10, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "x.npz", labels=np.zeros(5), images=x)
    prep = make_preprocess(32)
    ds, _, _, prep2 = calibration_datasets(str(tmp_path / "x.npy"), prep)
    assert len(ds) == 5 and prep2.size == (10, 8)
    assert torch.equal(ds[0][0], torch.from_numpy(x[0]))
    ds = calibration_datasets(f"{tmp_path / 'x.npz'}:images", prep)[0]
    assert ds[4][0].shape == (3, 10, 8)
    # the first array of the npz is the labels: a clear shape error
    with pytest.raises(TrtqatError, match=r"shape \(5,\), expected 4 dimensions"):
        calibration_datasets(str(tmp_path / "x.npz"), prep)
    with pytest.raises(TrtqatError, match="has no array 'nope'; it holds labels, images"):
        load_array(f"{tmp_path / 'x.npz'}:nope")
    np.save(tmp_path / "g.npy", x[:, :1])
    with pytest.raises(TrtqatError, match="has 1 channel.*takes 3: pass --channels 1"):
        calibration_datasets(str(tmp_path / "g.npy"), prep)
    with pytest.raises(TrtqatError, match="no such file"):
        load_array(tmp_path / "missing.npy")


def test_image_size_other_than_the_arrays_is_refused(tmp_path, capsys):
    """Arrays are used at their own size: a different --image-size was silently ignored."""
    from trtqat.cli import main

    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 3, 10, 8)).astype(
        np.float32))
    out = tmp_path / "ptq"
    argv = ["calibrate", "--model", f"{write_model(tmp_path)}:make", "--data",
            str(tmp_path / "x.npy"), "--out", str(out), "--device", "cpu", "--no-progress"]
    capsys.readouterr()
    assert main([*argv, "--image-size", "16"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--image-size 16x16 does not match --data" in err[0]
    assert "its images are 10x8" in err[0] and not out.exists()
    assert main([*argv, "--image-size", "10x8"]) == 0


def test_preprocess_checks():
    with pytest.raises(TrtqatError, match="--mean has 2 values for 3 channel"):
        make_preprocess(16, mean="0.1,0.2")
    with pytest.raises(TrtqatError, match="--std values must be > 0"):
        make_preprocess(16, std="0")
    assert make_preprocess((30, 20)).resize_to() == 34  # shorter side to max(size) / 0.875

"""Detection data on disk is checked before anything trains: every COCO and YOLO defect is
one line naming the file and the line, id or index; skippable defects are one warning with
a count (errors with ``--strict``); Ultralytics' layout and data.yaml load. Tiny generated
datasets (32x32 PNGs); one CLI run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_run import ROOT

from trtqat.families.detect import data as D
from trtqat.families.detect.data_layouts import find_splits

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(path: Path, w: int = 32, h: int = 32) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), 100, np.uint8)).save(path)


def _coco(root: Path, annotations: list | None = None, images: list | None = None,
          categories: list | None = None) -> Path:
    for i in range(2):
        _png(root / f"{i}.png")
    ann = [{"id": 10, "image_id": 0, "category_id": 1, "bbox": [2, 2, 10, 10]},
           {"id": 11, "image_id": 1, "category_id": 2, "bbox": [4, 4, 8, 8]}]
    (root / "annotations.json").write_text(json.dumps({
        "images": images if images is not None else [
            {"id": i, "file_name": f"{i}.png"} for i in range(2)],
        "annotations": ann if annotations is None else annotations,
        "categories": categories or [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}))
    return root


def _yolo(root: Path, labels: dict[str, str], classes: str | None = None) -> Path:
    for name, text in labels.items():
        _png(root / "images" / f"{name}.png")
        (root / "labels").mkdir(parents=True, exist_ok=True)
        (root / "labels" / f"{name}.txt").write_text(text)
    if classes is not None:
        (root / "classes.txt").write_text(classes)
    return root


BOX = {"id": 10, "image_id": 0, "category_id": 1}


@pytest.mark.parametrize("annotations,images,match", [
    ([{"id": 10, "image_id": 0, "category_id": 1}], None, r"annotation #0 \(id 10\) has no 'bbox'"),
    ([{"id": 10, "image_id": 0, "bbox": [1, 1, 2, 2]}], None, "has no 'category_id'"),
    (None, [{"id": 0}, {"id": 1, "file_name": "1.png"}], r"image #0 \(id 0\) has no 'file_name'"),
    ([{**BOX, "bbox": [1, 2, 3]}], None, r"annotation #0 \(id 10\): bbox \[1, 2, 3\] is not"),
    ([{**BOX, "bbox": ["1", "2", "3", "4"]}], None, "is not .x, y, width, height. .4 finite"),
    ([{**BOX, "bbox": [1, 2, float("nan"), 4]}], None, "4 finite numbers"),
    ([{**BOX, "bbox": [10, 10, -5, 4]}], None, "negative width or height"),
    ([{**BOX, "category_id": 7, "bbox": [1, 1, 5, 5]}], None,
     r"category_id 7 is not among the categories \(ids 1, 2\)"),
    ([{**BOX, "image_id": 5, "bbox": [1, 1, 5, 5]}], None, "image_id 5 is not among the images"),
    (None, [{"id": 0, "file_name": "../../outside.png"}], "leaves the dataset folder"),
    (None, [{"id": 0, "file_name": "/etc/outside.png"}], "is absolute"),
    (None, [{"id": 0, "file_name": "gone.png"}], "image gone.png not found"),
])
def test_coco_defects_are_one_line_naming_the_entry(tmp_path, annotations, images,
                                                    match) -> None:
    outside = tmp_path / "outside.png"
    _png(outside)  # exists: a path that leaves the folder must not read it
    root = _coco(tmp_path / "a" / "coco", annotations, images)
    with pytest.raises(D.DetectionDataError, match=match) as info:
        D.datasets(str(root), 32)
    assert "\n" not in str(info.value) and "annotations.json" in str(info.value)


@pytest.mark.parametrize("line,match", [
    ("0 0.5 0.5 0.2", "expected 'class cx cy w h'"),
    ("0 0.5 zero 0.2 0.2", "expected 'class cx cy w h'"),
    ("0 0.5 0.5 0.2 0.2 0.9", "6 columns: a box is"),  # 5 coordinates: neither form
    ("0 0.1 0.1 0.5 0.1 0.5 0.5 0.1", "8 columns"),  # odd coordinate count
    ("-1 0.5 0.5 0.2 0.2", "class '-1' is not a class index"),
    ("0.7 0.5 0.5 0.2 0.2", "class '0.7' is not a class index"),
    ("3 0.5 0.5 0.2 0.2", r"class 3, but .*classes.txt names 3 class\(es\) \(0..2\)"),
    ("0 12 16 8 8", r"coordinates outside \[0, 1\]"),
    ("0 0.5 0.5 -0.2 0.2", "negative width or height"),
    ("0 0.5 nan 0.2 0.2", "non-finite"),
])
def test_yolo_label_defects_name_file_and_line(tmp_path, line, match) -> None:
    root = _yolo(tmp_path / "yolo", {"a": "1 0.5 0.5 0.2 0.2\n", "b": f"2 0.5 0.5 0.1 0.1\n{line}\n"},
                 classes="x\ny\nz\n")
    with pytest.raises(D.DetectionDataError, match=match) as info:
        D.datasets(str(root), 32)
    assert f"{root / 'labels' / 'b.txt'}:2:" in str(info.value) and "\n" not in str(info.value)


def test_polygon_lines_become_their_bounding_boxes(tmp_path, caplog) -> None:
    root = _yolo(tmp_path / "yolo", {"a": "1 0.25 0.25 0.75 0.25 0.75 0.5 0.25 0.5\n",
                                     "b": "0 0.5 0.5 0.5 0.5\n"})
    with caplog.at_level(logging.WARNING):
        splits = find_splits(str(root))
    boxes = {p.stem: t.tolist() for p, t in splits.train}
    assert boxes["a"] == [[1.0, 8.0, 8.0, 24.0, 16.0]] and splits.classes == ["0", "1"]
    assert "1 polygon (segmentation) label line(s)" in caplog.text


def _box_outside(root: Path) -> Path:
    return _coco(root, [{**BOX, "bbox": [2, 2, 10, 10]},
                        {"id": 11, "image_id": 1, "category_id": 2, "bbox": [40, 40, 5, 5]}])


def _not_an_image(root: Path) -> Path:
    root = _yolo(root, {"a": "0 0.5 0.5 0.2 0.2\n", "b": "0 0.5 0.5 0.2 0.2\n"})
    (root / "images" / "c.png").write_text("not a png")
    return root


def _empty_label(root: Path) -> Path:
    return _yolo(root, {"a": "0 0.5 0.5 0.2 0.2\n", "b": "\n"})


def _zero_size(root: Path) -> Path:
    return _yolo(root, {"a": "0 0.5 0.5 0.2 0.2\n", "b": "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0 0.1\n"})


@pytest.mark.parametrize("make,kind", [
    (_box_outside, "1 x box entirely outside its image"),
    (_not_an_image, "1 x unreadable image"),
    (_empty_label, "1 x image without boxes (empty or missing label file)"),
    (_zero_size, "1 x box of zero width or height"),
])
def test_skippable_defects_warn_with_a_count_and_strict_refuses_them(tmp_path, caplog, make,
                                                                     kind) -> None:
    root = make(tmp_path / "data")
    with caplog.at_level(logging.WARNING):
        train, val, _ = D.datasets(str(root), 32)
    assert kind in caplog.text and "--strict refuses them" in caplog.text
    assert len(train) + len(val) == 2  # unreadable images left out, background kept
    with pytest.raises(D.DetectionDataError, match="drop --strict") as info:
        D.datasets(str(root), 32, strict=True)
    assert kind.split(" x ")[1] in str(info.value)


@pytest.mark.parametrize("make", [
    lambda root: _coco(root, []),
    lambda root: _coco(root, [{**BOX, "bbox": [50, 50, 4, 4]}]),
    lambda root: _yolo(root, {"a": "", "b": "\n"}),
])
def test_a_dataset_without_usable_boxes_is_refused(tmp_path, make) -> None:
    with pytest.raises(D.DetectionDataError, match="no usable boxes"):
        D.datasets(str(make(tmp_path / "data")), 32)


def _ultralytics(root: Path, train: int = 3, val: int = 2) -> Path:
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            _png(root / "images" / split / f"{i}.png")
            (root / "labels" / split).mkdir(parents=True, exist_ok=True)
            (root / "labels" / split / f"{i}.txt").write_text(f"{i % 3} 0.5 0.5 0.25 0.5\n")
    return root


@pytest.mark.parametrize("yaml_text,where", [
    ("path: {root}\ntrain: images/train\nval: images/val\nnames: [cat, dog, bird]\n"
     "download: https://example.invalid/never.zip\n", "outside"),
    ("train: images/train\nval: images/val\nnames:\n  0: cat\n  1: dog\n  2: bird\n", "inside"),
    ("path: ../datasets/elsewhere\ntrain: images/train\nval: images/val\nnc: 3\n"
     "names: [cat, dog, bird]\n", "inside"),
])
def test_ultralytics_layout_and_data_yaml(tmp_path, yaml_text, where) -> None:
    root = _ultralytics(tmp_path / "coco8")
    train, val, classes = D.datasets(str(root), 32)  # the layout alone: names are indices
    assert (len(train), len(val), classes) == (3, 2, ["0", "1", "2"])
    yaml_path = (tmp_path if where == "outside" else root) / "data.yaml"
    yaml_path.write_text(yaml_text.format(root=root))
    train, val, classes = D.datasets(str(yaml_path), 32)
    assert (len(train), len(val), classes) == (3, 2, ["cat", "dog", "bird"])
    assert np.allclose(val[1][1].numpy(), [[1, 12, 8, 20, 24]])
    if where == "inside":  # the folder of a data.yaml reads it
        assert D.datasets(str(root), 32)[2] == ["cat", "dog", "bird"]


def test_cocos_own_layout_reads_each_split_from_its_file(tmp_path) -> None:
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    for split, count in (("train2017", 3), ("val2017", 2)):
        for i in range(count):
            _png(root / split / f"{split}_{i}.png")
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps({
            "images": [{"id": i, "file_name": f"{split}_{i}.png"} for i in range(count)],
            "annotations": [{"id": i, "image_id": i, "category_id": 3, "bbox": [1, 1, 9, 9]}
                            for i in range(count)],
            "categories": [{"id": 3, "name": "person"}]}))
    (root / "annotations" / "captions_train2017.json").write_text("{}")
    train, val, classes = D.datasets(str(root), 32)
    assert (len(train), len(val), classes) == (3, 2, ["person"])
    assert val[1][1].tolist() == [[0.0, 1.0, 1.0, 10.0, 10.0]]


@pytest.mark.parametrize("yaml_text,match", [
    ("val: images/val\n", "it needs 'train'"),
    ("train: images/nowhere\nval: images/val\n", "images/nowhere not found"),
    ("train: images/train\nval: images/val\nnames: [a, b, c]\nnc: 2\n", "nc is 2 but names"),
    ("train: images/train\nval: images/val\nnames: {0: a, 2: c}\n", r"has ids \[0, 2\]"),
    ("train: images/train\nval: images/val\nnames: [a, b]\n", r"class 2, but .*names 2"),
    ("train: list.txt\nval: images/val\n", "leaves the dataset folder"),
])
def test_data_yaml_defects_are_one_line(tmp_path, yaml_text, match) -> None:
    root = _ultralytics(tmp_path / "ds")
    (root / "list.txt").write_text("images/train/0.png\n../elsewhere/x.png\n")
    (root / "data.yaml").write_text(yaml_text)
    with pytest.raises(D.DetectionDataError, match=match) as info:
        D.datasets(str(root / "data.yaml"), 32)
    assert "\n" not in str(info.value)


def test_cli_strict_refuses_a_skippable_defect_in_one_line(tmp_path) -> None:
    root = _empty_label(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "trtqat", "train", "--model", "yolo_digits",
                           "--data", str(root), "--strict", "--image-size", "32",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "b.txt: image without boxes" in proc.stderr and "drop --strict" in proc.stderr
    assert not (tmp_path / "run" / "last.pt").exists()


def test_detection_data_given_to_a_classifier_points_to_the_detectors(tmp_path) -> None:
    from trtqat.families.cnn.data import DataError, make_datasets

    root = _ultralytics(tmp_path / "ds")
    (tmp_path / "data.yaml").write_text("train: ds/images/train\n")
    for data in (root, tmp_path / "data.yaml"):
        with pytest.raises(DataError, match="looks like detection data.*--model detect:"):
            make_datasets(str(data), 32)


def test_training_loader_drops_a_last_batch_of_one_image():
    """BatchNorm cannot train on one image ("Expected more than 1 value per channel")."""
    data = [(torch.zeros(3, 8, 8), torch.zeros(0, 5)) for _ in range(5)]
    assert [len(x) for x, _ in D.loader(data, 2, True)] == [2, 2]
    assert [len(x) for x, _ in D.loader(data, 2, False)] == [2, 2, 1]  # evaluation keeps all

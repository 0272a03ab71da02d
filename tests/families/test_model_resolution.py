"""Which family a --model takes, as a general rule: names and the files each family builds
from (an Ultralytics .yaml/.pt decided without unpickling); any other path is one line
listing what --model takes, also for a path too long for the file system. An Ultralytics .pt
(a pickle) is loaded only with --trust-model-file."""

from __future__ import annotations

import os

import pytest
import torch

from trtqat import families
from trtqat.cli import main

YAML = "nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\nhead:\n  - [[0], 1, Detect, [nc]]\n"


class Payload:
    """Pickles as a call that writes a marker file."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def files(tmp_path):
    (tmp_path / "det").mkdir()
    (tmp_path / "det" / "yolov8n.yaml").write_text(YAML)
    (tmp_path / "det" / "data.yaml").write_text("path: x\nnames: [a, b]\n")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "images").mkdir()
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    return tmp_path


@pytest.mark.parametrize("model, family", [
    ("det/yolov8n.yaml", "detect"), ("yolov8n.yaml", "detect"), ("yolo11n-seg.yaml", "detect"),
    ("hf", "encoder"), ("minilm", "encoder"), ("net.py:make", "cnn"), ("models/net.py:make", "cnn"),
    ("resnet50.a1_in1k", "cnn"), ("timm:resnet18", "cnn"), ("vit_b_16", "vit"),
    ("detect:det/my.py:make", "detect"),
    ("det/missing.yaml", "no such file or folder"), ("models/bert", "no such file or folder"),
    ("det/data.yaml", "a .yaml that is not an Ultralytics model"),
    ("weights.pt", "a .pt that is not an Ultralytics model"),
    ("images", None),  # a bare word: a model name, the CNN family's to refuse
    ("images/", "a folder with no config.json"),
    ("x" * 300 + ".pt", "no such file or folder"), ("/" + "y" * 300 + "/z.yaml", "no such file"),
])
def test_model_resolution(files, monkeypatch, model, family):
    monkeypatch.chdir(files)
    if family is None or family in families.names():
        assert families.of_model(model).name == (family or "cnn")
        return
    with pytest.raises(families.UnknownModelError) as info:
        families.of_model(model)
    line = str(info.value)
    assert family in line and len(line.splitlines()) == 1, line
    for form in ("file.py:factory", "Hugging Face", "Ultralytics YOLO .yaml/.pt", "vit"):
        assert form in line, line


def test_an_ultralytics_pt_is_refused_before_it_is_unpickled(tmp_path, capsys):
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"model": Payload(marker), "type": tasks.DetectionModel}, evil)
    assert families.of_model(str(evil)).name == "detect"  # decided without unpickling
    assert not marker.exists()
    argv = ["calibrate", "--model", str(evil), "--num-batches", "1", "--no-progress",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a pickle" in err[0] and "--trust-model-file" in err[0], err
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert main([*argv, "--trust-model-file"]) == 1  # Ultralytics loads it: the payload ran
    assert marker.exists()


@pytest.mark.parametrize("argv", [["--model", "{long}.py:make"], ["--model", "detect:{long}.py:make"],
                                  ["--model", "{long}"], ["--checkpoint", "{long}.pt"],
                                  ["--model", "resnet18", "--weights", "{long}.pt"]])
def test_paths_too_long_for_the_file_system_are_one_line(tmp_path, capsys, argv):
    long = str(tmp_path / ("z" * 300))
    out = tmp_path / "run"
    try:  # refused while parsing (argparse exits) or by the command: one line, exit 1
        rc = main(["calibrate", *[a.format(long=long) for a in argv], "--num-batches", "1",
                   "--no-progress", "--out", str(out)])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "zzz" in err[0], err  # about the path, not a crash
    assert not out.exists()

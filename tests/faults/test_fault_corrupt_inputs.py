"""A corrupt file of every input kind: one line naming the problem, exit 1, no output."""

from __future__ import annotations

import json
import os

import pytest
import torch
from faultlib import one_error_line, run_cli

from trtqat.runs.checkpoint import FORMAT

RANDOM = os.urandom(4096)


def _inputs(tmp, conv_onnx, kind):
    """Write the corrupt input ``kind`` into ``tmp``; returns its path."""
    path = tmp / {"ckpt-random": "r.pt", "ckpt-empty": "e.pt", "ckpt-no-state": "s.pt",
                  "ckpt-folder": "ckdir", "onnx-empty": "e.onnx", "onnx-random": "r.onnx",
                  "onnx-folder": "o.onnx", "engine-random": "r.engine",
                  "engine-truncated": "t.engine", "engine-folder": "f.engine",
                  "engine-newer": "n.engine", "engine-version-text": "v.engine",
                  "npz-random": "c.npz", "imagefolder-one-class": "data"}[kind]
    if kind in ("ckpt-random", "onnx-random", "engine-random", "npz-random"):
        path.write_bytes(RANDOM)
    elif kind in ("ckpt-empty", "onnx-empty"):
        path.write_bytes(b"")
    elif kind == "ckpt-no-state":
        torch.save({"format": FORMAT, "stage": "fp32",
                    "model": {"arch": "resnet18", "num_classes": 10}}, path)
    elif kind in ("ckpt-folder", "onnx-folder", "engine-folder"):
        path.mkdir()
    elif kind == "engine-truncated":
        assert run_cli_ok(["build", "--onnx", str(conv_onnx), "--out", str(path)])
        path.write_bytes(path.read_bytes()[:-20])
    elif kind in ("engine-newer", "engine-version-text"):  # a sidecar of a future trtqat
        assert run_cli_ok(["build", "--onnx", str(conv_onnx), "--out", str(path)])
        side = path.with_name(path.name + ".json")
        meta = json.loads(side.read_text())
        side.write_text(json.dumps(meta | {"format_version": 999 if kind == "engine-newer"
                                           else "1"}))
    elif kind == "imagefolder-one-class":
        from PIL import Image

        for split in ("train", "val"):
            (path / split / "only").mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(path / split / "only" / "a.png")
    return path


def run_cli_ok(argv):
    from trtqat.cli import main

    return main(argv) == 0


CKPT_COMMANDS = [["export", "--out", "{tmp}/out", "--checkpoint"],
                 ["calibrate", "--out", "{tmp}/out", "--checkpoint"],
                 ["qat", "--out", "{tmp}/out", "--checkpoint"],
                 ["sensitivity", "--out", "{tmp}/out", "--checkpoint"]]
CASES = [
    *[(cmd, "ckpt-random", "is not a file of tensors and plain types") for cmd in CKPT_COMMANDS],
    (CKPT_COMMANDS[0], "ckpt-empty", "is not a file of tensors and plain types"),
    (CKPT_COMMANDS[0], "ckpt-no-state", "incomplete trtqat checkpoint (no 'state_dict'"),
    (CKPT_COMMANDS[1], "ckpt-no-state", "incomplete trtqat checkpoint"),
    (CKPT_COMMANDS[0], "ckpt-folder", "holds no best.pt or last.pt"),
    (["build", "--out", "{tmp}/out/e.engine", "--onnx"], "onnx-empty", "is empty"),
    (["build", "--out", "{tmp}/out/e.engine", "--onnx"], "onnx-random", "is not an ONNX model"),
    (["build", "--out", "{tmp}/out/e.engine", "--onnx"], "onnx-folder", "is a folder, not an "
                                                                        "ONNX file"),
    (["lint"], "onnx-empty", "is empty or not an ONNX file"),
    (["lint"], "onnx-random", "is not an ONNX model (truncated or another format)"),
    (["lint"], "onnx-folder", "is a folder, not an ONNX file"),
    (["trtqat-exec", "--loadEngine"], "engine-random", "is not an ONNX model"),
    (["trtqat-exec", "--loadEngine"], "engine-truncated", "does not match its sidecar"),
    (["trtqat-exec", "--loadEngine"], "engine-folder", "is a folder, not an engine file"),
    (["trtqat-exec", "--loadEngine"], "engine-newer", "has format_version 999, written by a "
                                                      "newer trtqat (this one reads up to 1): "
                                                      "upgrade trtqat"),
    (["trtqat-exec", "--loadEngine"], "engine-version-text", "has format_version '1', not a "
                                                             "version number"),
    (["trtqat-exec", "--onnx", "{onnx}", "--calibInputs"], "npz-random", "--calibInputs: "
                                                                         "cannot read"),
    (["train", "--out", "{tmp}/out", "--data"], "imagefolder-one-class",
     "has 1 class folder (only): a classifier needs at least 2"),
]


@pytest.mark.parametrize("argv, kind, needle", CASES,
                         ids=[f"{c[0][0]}-{c[1]}" for c in CASES])
def test_corrupt_input_is_one_line(tmp_path, capsys, conv_onnx, argv, kind, needle):
    path = _inputs(tmp_path, conv_onnx, kind)
    names = {"tmp": tmp_path, "onnx": conv_onnx}
    rc, err = run_cli(capsys, [a.format(**names) for a in argv] + [str(path)])
    line = one_error_line(rc, err, needle)
    assert "weights_only=False" not in line and "weights_only` set to `False" not in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.*"))

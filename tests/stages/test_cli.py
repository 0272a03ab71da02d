"""The train/calibrate/qat commands: help, and one-line errors that leave nothing behind."""

from __future__ import annotations

import pytest
import torch

from trtqat.cli import build_parser, main


@pytest.mark.parametrize("command, words", [
    ("train", ["--model", "--epochs", "--resume", "--data", "torchrun"]),
    ("calibrate", ["--method", "--percentile", "--num-batches", "--checkpoint"]),
    ("qat", ["10%", "--lr", "--epochs", "--resume"]),
])
def test_help(command, words, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert all(w in text for w in words)


def _fails(argv, capsys, match):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert match in err, err


def test_unknown_model_lists_close_matches(tmp_path, capsys):
    out = tmp_path / "run"
    _fails(["train", "--model", "resnet19", "--data", "synthetic", "--out", str(out)], capsys,
           "resnet18")
    assert not out.exists()


def test_bad_image_folder(tmp_path, capsys):
    (tmp_path / "ds" / "train" / "a").mkdir(parents=True)
    out = tmp_path / "run"
    _fails(["train", "--data", str(tmp_path / "ds"), "--out", str(out)], capsys, "val/")
    assert not out.exists()


def test_stage_errors(fp32_run, tmp_path, capsys):
    out = tmp_path / "run"
    _fails(["calibrate", "--checkpoint", str(tmp_path / "missing" / "best.pt"), "--out",
            str(out)], capsys, "does not exist")
    _fails(["calibrate", "--checkpoint", str(tmp_path / "missing"), "--out", str(out)], capsys,
           "does not exist")
    _fails(["qat", "--checkpoint", str(fp32_run / "best.pt"), "--out", str(out)], capsys,
           "calibrate it first")
    _fails(["calibrate", "-c", str(fp32_run), "--model", "resnet34", "--out", str(out)], capsys,
           "holds a resnet18, not a resnet34")
    _fails(["qat", "-c", str(fp32_run), "--resume", "--out", str(out)], capsys,
           "nothing to resume")
    assert not out.exists()


def test_checkpoint_of_another_architecture(fp32_run, tmp_path, capsys):
    ckpt = torch.load(fp32_run / "best.pt", weights_only=True)
    ckpt["model"]["arch"] = "mobilenet_v2"
    torch.save(ckpt, tmp_path / "wrong.pt")
    out = tmp_path / "run"
    _fails(["calibrate", "-c", str(tmp_path / "wrong.pt"), "--out", str(out)], capsys,
           "another architecture")
    assert not out.exists()

"""``trtqat calibrate``/``qat`` on a sentence encoder: the tiny BERT folder and a text file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import yaml

from trtqat.cli import main
from trtqat.families import build_from_checkpoint
from trtqat.families.encoder.checkpoint import is_encoder_checkpoint
from trtqat.families.encoder.minilm import SentenceEncoder
from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.run_dir import read_metrics

WORDS = ("the quick brown fox jumps over lazy dog return a new list containing every item of "
         "sequence quantized model runs its matrix products in eight bit integers").split()

FAST = ["--max-length", "24", "--batch-size", "8", "--no-progress"]


def _write_sentences(path: Path, n: int = 48) -> Path:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
             for _ in range(n)]
    path.write_text("\n".join(lines) + "\n\n")
    return path


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory) -> dict:
    """A PTQ run (method max) and a 2-step QAT run of the tiny folder, through the CLI."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cli") / "tiny"
    text = _write_sentences(root.parent / "sentences.txt")
    try:
        rc_ptq = main(["calibrate", "--model", str(tiny_dir), "--data", str(text),
                       "--method", "max", "--num-sentences", "16", "--out", str(root / "ptq"),
                       *FAST])
        rc_qat = main(["qat", "--checkpoint", str(root / "ptq" / "best.pt"), "--max-steps", "2",
                       "--skip-layers", "*.layer.1.output.dense", "--out", str(root / "qat"),
                       "--batch-size", "8", "--no-progress"])
    finally:
        torch.set_num_threads(n)
    return {"root": root, "text": text, "rc": (rc_ptq, rc_qat)}


def test_calibrate_writes_ptq_and_fp32_runs(runs, tiny_dir):
    assert runs["rc"][0] == 0
    root = runs["root"]
    ptq = load_checkpoint(root / "ptq" / "best.pt")
    fp32 = load_checkpoint(root / "fp32" / "best.pt")
    assert is_encoder_checkpoint(ptq) and ptq["stage"] == "ptq" and ptq["model"]["quantized"]
    assert fp32["stage"] == "fp32" and not fp32["model"]["quantized"]
    assert ptq["model"]["arch"] == str(Path(tiny_dir).resolve())
    assert ptq["calib"]["method"] == "max" and ptq["calib"]["sentences_seen"] == 16
    assert ptq["model"]["max_length"] == 24
    assert Path(ptq["fp32_checkpoint"]) == (root / "fp32" / "best.pt").resolve()
    args = yaml.safe_load((root / "ptq" / "args.yaml").read_text())
    assert args["data"] == str(runs["text"]) and args["method"] == "max"
    rec = read_metrics(root / "ptq")[-1]
    # 48 lines -> 5 held-out sentences; a random tiny BERT loses some fidelity at int8
    assert rec["sentences"] == 5 and 0.5 < rec["mean_cosine"] < 1.0
    assert -1.0 <= rec["spearman"] <= 1.0
    assert ptq["metrics"]["mean_cosine"] == rec["mean_cosine"]
    # the PTQ checkpoint rebuilds into a calibrated encoder (through the CNN entry point too)
    model = build_from_checkpoint(ptq)
    assert isinstance(model, SentenceEncoder)
    fp32_weights = build_from_checkpoint(fp32).state_dict()
    assert all(torch.equal(v, fp32_weights[k]) for k, v in
               build_from_checkpoint(ptq, quantized=False).state_dict().items())


def test_qat_writes_qat_run_with_fidelity(runs, capsys):
    assert runs["rc"][1] == 0
    root = runs["root"]
    ckpt = load_checkpoint(root / "qat" / "best.pt")
    assert ckpt["stage"] == "qat" and is_encoder_checkpoint(ckpt)
    assert ckpt["model"]["skip_layers"] == ["*.layer.1.output.dense"]
    from trtqat.quant.model_ops import quantizers

    rebuilt = dict(quantizers(build_from_checkpoint(ckpt)))
    # the skipped layer stays in float after a rebuild; its twin in layer 0 is quantized
    assert all(q.disabled for n, q in rebuilt.items() if "layer.1.output.dense" in n)
    kept = [q for n, q in rebuilt.items() if "layer.0.output.dense" in n]
    assert kept and not any(q.disabled for q in kept)
    records = read_metrics(root / "qat")
    assert records[0]["step"] == 0 and records[-1]["step"] == 2
    start, end = records[0], records[-1]
    assert start["mean_cosine"] == pytest.approx(read_metrics(root / "ptq")[-1]["mean_cosine"])
    assert 0.5 < end["mean_cosine"] <= 1.0 and end["start_mean_cosine"] == start["mean_cosine"]
    assert ckpt["metrics"]["mean_cosine"] == end["mean_cosine"]
    args = yaml.safe_load((root / "qat" / "args.yaml").read_text())
    assert args["teacher"].endswith("best.pt") and args["steps"] == 2
    assert args["data"] == str(runs["text"])  # inherited from the PTQ run
    # the QAT weights moved away from the PTQ ones
    ptq = load_checkpoint(root / "ptq" / "best.pt")["state_dict"]
    assert any(not torch.equal(v, ptq[k]) for k, v in ckpt["state_dict"].items()
               if k in ptq and v.is_floating_point() and "_amax" not in k)


def test_second_calibration_reuses_the_fp32_run(runs, tiny_dir):
    root = runs["root"]
    before = (root / "fp32" / "best.pt").stat().st_mtime_ns
    rc = main(["calibrate", "--model", str(tiny_dir), "--data", str(runs["text"]),
               "--num-sentences", "8", "--out", str(root / "ptq-mse"), *FAST])
    assert rc == 0
    assert load_checkpoint(root / "ptq-mse")["calib"]["method"] == "mse"  # encoder default
    assert (root / "fp32" / "best.pt").stat().st_mtime_ns == before


def _one_line_error(capsys, argv: list[str], match: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_bad_inputs_write_nothing(tiny_dir, tmp_path, capsys):
    out = tmp_path / "runs" / "ptq"
    common = ["--out", str(out), *FAST]
    _one_line_error(capsys, ["calibrate", "--model", str(tiny_dir), "--data",
                             str(tmp_path / "missing.txt"), *common], "no such file")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    _one_line_error(capsys, ["calibrate", "--model", str(tiny_dir), "--data", str(empty),
                             *common], "holds no sentences")
    no_config = tmp_path / "not-a-model"
    no_config.mkdir()
    _one_line_error(capsys, ["calibrate", "--model", str(no_config), *common], "no config.json")
    _one_line_error(capsys, ["calibrate", *common], "--checkpoint is required")
    _one_line_error(capsys, ["calibrate", "--model", str(tmp_path / "my_cnn.py:make"), *common],
                    "my_cnn.py does not exist")  # a CNN factory, not an encoder folder
    assert not (tmp_path / "runs").exists()


def test_qat_refuses_fp32_and_resume(runs, capsys, tmp_path):
    fp32 = str(runs["root"] / "fp32" / "best.pt")
    _one_line_error(capsys, ["qat", "--checkpoint", fp32, "--out", str(tmp_path / "q")],
                    "calibrate it first")
    ptq = str(runs["root"] / "ptq" / "best.pt")
    _one_line_error(capsys, ["qat", "--checkpoint", ptq, "--resume", "--out",
                             str(runs["root"] / "qat")], "not supported for encoder")
    assert not (tmp_path / "q").exists()


def test_calibrate_from_an_fp32_encoder_checkpoint(runs):
    root = runs["root"]
    fp32 = root / "fp32" / "best.pt"
    before = fp32.stat().st_mtime_ns
    rc = main(["calibrate", "--checkpoint", str(fp32), "--data", str(runs["text"]),
               "--method", "percentile", "--percentile", "99.9", "--num-sentences", "8",
               "--skip-layers", "*output.dense", "--out", str(root / "ptq-pct"), *FAST])
    assert rc == 0
    ckpt = load_checkpoint(root / "ptq-pct")
    assert ckpt["stage"] == "ptq" and ckpt["calib"]["percentile"] == 99.9
    assert ckpt["model"]["skip_layers"] == ["*output.dense"]
    assert fp32.stat().st_mtime_ns == before  # the reference is the source: left alone
    from trtqat.stages.compare.variants import discover

    names = [v.name for v in discover(root)[0]]
    assert "ptq-percentile-99.9" in names and "fp32" in names

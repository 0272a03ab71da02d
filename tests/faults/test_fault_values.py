"""Each invalid value gets one line and exit 1, before any work or any file is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from faultlib import one_error_line, run_cli

from trtqat.engines import timing

# (argv, words the one error line must hold); {tmp} is the test's folder, {file} a regular
# file in it, {onnx} a tiny ONNX model there.
CASES = [
    (["train", "--lr", "nan"], "--lr: expected a finite number > 0"),
    (["train", "--lr", "inf"], "--lr: expected a finite number > 0"),
    (["train", "--lr", "1e308"], "--lr: expected a finite number > 0 and <= 10 (learning rate)"),
    (["qat", "--checkpoint", "x.pt", "--lr", "11"], "<= 10 (learning rate), got '11'"),
    (["train", "--weight-decay", "nan"], "--weight-decay/--wd: expected a finite number >= 0"),
    (["train", "--momentum", "1.5"], "--momentum: expected a finite number >= 0 and < 1"),
    (["train", "--label-smoothing", "1"], "--label-smoothing"),
    (["train", "--epochs", "0"], "--epochs: expected an integer >= 1, got '0'"),
    (["train", "--batch-size", "-2"], "--batch-size"),
    (["train", "--image-size", "0"], "--image-size"),
    (["train", "--warmup-epochs", "-1"], "--warmup-epochs: expected a finite number >= 0 "
                                         "(epochs)"),
    (["train", "--num-classes", "1"], "--num-classes: expected an integer >= 2"),
    (["train", "--workers", "-1"], "--workers"),
    (["train", "--seed", "-1"], "--seed"),
    (["train", "--out", "{file}"], "is a file, not a folder"),
    (["train", "--out", "{file}/run"], "which is a file, not a folder"),
    (["calibrate", "--checkpoint", "x.pt", "--percentile", "0"], "--percentile: expected a "
                                                                  "finite number > 0 and <= 100"),
    (["calibrate", "--checkpoint", "x.pt", "--num-batches", "0"], "--num-batches"),
    (["calibrate", "--checkpoint", "x.pt", "--out", "{file}/ptq"], "which is a file"),
    (["qat", "--checkpoint", "x.pt", "--lr", "-1"], "--lr"),
    (["export", "--checkpoint", "x.pt", "--val-batches", "-3"], "--val-batches: expected an "
                                                                 "integer >= 1, got '-3'"),
    (["export", "--checkpoint", "x.pt", "--val-batches", "0"], "--val-batches"),
    (["export", "--checkpoint", "x.pt", "--image-size", "0"], "--image-size"),
    (["export", "--checkpoint", "x.pt", "--batch", "0"], "--batch: expected 'dynamic' or an "
                                                          "integer >= 1"),
    (["export", "--checkpoint", "x.pt", "--out", "{file}"], "is a file, not a folder"),
    (["build", "--onnx", "{onnx}", "--out", "{tmp}"], "is a folder; give a file path"),
    (["build", "--onnx", "{onnx}", "--out", "{file}/e.engine"], "which is a file"),
    (["compare", "--run", "r", "--duration", "nan"], "--duration: expected a finite number > 0 "
                                                     "(seconds)"),
    (["compare", "--run", "r", "--batch-sizes", "0,32"], "--batch-sizes"),
    (["compare", "--run", "r", "--warmup", "-1"], "--warmup"),
    (["sensitivity", "--checkpoint", "x.pt", "--top", "0"], "--top"),
    (["demo", "--epochs", "0"], "--epochs"),
    (["trtqat-exec", "--onnx={onnx}", "--saveEngine={file}/e.engine"], "which is a file"),
    (["trtqat-exec", "--onnx={onnx}", "--saveEngine={tmp}"], "is a folder"),
    (["trtqat-exec", "--onnx={onnx}", "--exportTimes={file}/t.json"], "which is a file"),
    (["trtqat-exec", "--onnx={onnx}", "--shapes=x:0x3x8x8"], "a zero dimension in 'x:0x3x8x8'"),
    (["trtqat-exec", "--onnx={onnx}", "--shapes=x:99999999999x3x8x8"],
     "GiB of memory; use a smaller batch"),
    (["trtqat-exec", "--onnx={onnx}", "--duration=nan"], "--duration"),
    (["trtqat-exec", "--onnx={onnx}", "--iterations=0"], "--iterations"),
    (["build", "--onnx", "{onnx}", "--out", "x.engine", "--shapes", "x:-1x3x8x8"],
     "a negative dimension"),
    (["train", "--mean", "nan"], "--mean: expected comma-separated finite numbers"),
    (["train", "--mean", "0.5,inf,0.5"], "--mean: expected comma-separated finite numbers"),
    (["train", "--std", "0.2,nan,0.2"], "--std: expected comma-separated finite numbers > 0"),
    (["train", "--std", "0"], "--std: expected comma-separated finite numbers > 0"),
    (["calibrate", "--checkpoint", "x.pt", "--std=-inf"], "--std: expected"),
    (["train", "--data", "digits", "--mean", "0.5"], "--mean would be ignored with --data "
                                                     "digits"),
    (["train", "--data", "synthetic", "--std", "0.5", "--resize", "40"],
     "--std/--resize would be ignored with --data synthetic"),
    (["calibrate", "--checkpoint", "x.pt", "--data", "digits", "--mean", "0.4,0.4,0.4"],
     "--mean would be ignored with --data digits"),
    (["train", "--image-size", "100000"], "--image-size 100000x100000 needs 3.84 TB for one "
                                          "batch (32 x 3 x 100000 x 100000 x 4 bytes)"),
    (["calibrate", "--checkpoint", "x.pt", "--image-size", "300000x400000", "--channels", "1"],
     "--image-size 300000x400000 needs 480 GB for one batch (1 x 1 x 300000 x 400000"),
    (["qat", "--checkpoint", "x.pt", "--image-size", "100000"], "more than this machine's"),
    # a path component over NAME_MAX: checked once for every path argument (cli/validate.py)
    *[(argv, "is 300 bytes long, more than a file name may be (255 bytes); use a shorter name")
      for argv in (["train", "--out", "{long}"], ["train", "--data", "{long}"],
                   ["export", "--checkpoint", "{long}"],
                   ["export", "--checkpoint", "x.pt", "--out", "r/{long}/x"],
                   ["calibrate", "--model", "{long}"], ["compare", "--run", "{long}"],
                   ["sensitivity", "--checkpoint", "{long}"],
                   ["trtqat-exec", "--onnx={long}"],
                   ["trtqat-exec", "--onnx={onnx}", "--exportTimes={long}"],
                   ["trtqat-exec", "--onnx={onnx}", "--saveEngine={long}"])],
]


@pytest.mark.parametrize("argv, needle", CASES,
                         ids=[" ".join(c[0][:3]).replace("{long}", "LONG") for c in CASES])
def test_invalid_value_is_one_line(tmp_path, capsys, monkeypatch, conv_onnx, argv, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a folder")
    names = {"tmp": tmp_path, "file": tmp_path / "file", "onnx": conv_onnx, "long": "a" * 300}
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, err = run_cli(capsys, [a.format(**names) for a in argv])
    one_error_line(rc, err, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert (tmp_path / "file").read_text() == "not a folder"


def test_benchmark_advice_names_only_flags_trtqat_exec_takes():
    from trtqat.cli.exec_cmd import build_parser

    known = set(build_parser()._option_string_actions)
    source = Path(timing.__file__).read_text()
    advised = set(re.findall(r"(--[A-Za-z]+)", timing.UNSTABLE_ADVICE + source))
    assert advised and advised <= known, advised - known


def test_validators_accept_good_values_and_name_the_bad(tmp_path):
    from trtqat.cli import validate as v

    assert v.positive_int(" 3") == 3 and v.int_list("1,32") == (1, 32)
    assert v.finite_float(gt=0, le=100, unit="percent")("99.9") == 99.9
    assert v.probability("0") == 0.0
    (tmp_path / "f").write_text("x")
    assert v.existing_file(str(tmp_path / "f")) == str(tmp_path / "f")
    assert v.existing_dir(str(tmp_path)) == str(tmp_path)
    assert v.writable_dir(str(tmp_path / "a" / "b")) and not (tmp_path / "a").exists()
    for check, text, words in [
        (v.positive_int, "1.5", "expected an integer >= 1, got '1.5'"),
        (v.finite_float(gt=0, le=100, unit="percent"), "-inf", "(percent), got '-inf'"),
        (v.probability, "1.01", "expected a finite number >= 0 and <= 1 (a fraction)"),
        (v.int_list, "", "comma-separated integers >= 1"),
        (v.existing_file, str(tmp_path), "is a folder, not a file"),
        (v.existing_file, str(tmp_path / "nope"), "does not exist"),
        (v.existing_dir, str(tmp_path / "f"), "is a file, not a folder"),
        (v.writable_file, str(tmp_path), "is a folder; give a file path"),
    ]:
        with pytest.raises(v.BadValue, match=re.escape(words)):
            check(text)


def test_absurd_lr_is_refused_and_an_overflowing_update_stops_like_a_nan_loss():
    import torch

    from trtqat.runopts import ConfigError
    from trtqat.runs.accel import Accel
    from trtqat.runs.health import NonFiniteLossError
    from trtqat.stages.train import TrainConfig

    with pytest.raises(ConfigError, match="--lr must be <= 10"):
        TrainConfig(lr=1e308)  # the Python API's configs: the CLI's bound
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e308)
    with pytest.raises(NonFiniteLossError, match="overflowed"):  # a clean stop, not a traceback
        Accel("cpu").backward_step(model(torch.ones(1, 2)).sum(), optimizer)


NET = """from torch import nn

def make(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, num_classes))
"""


@pytest.fixture(scope="module")
def ptq(tmp_path_factory):
    """A calibrated run of a one-input, one-output net (16 px images)."""
    from trtqat.cli import main

    root = tmp_path_factory.mktemp("ptq")
    (root / "net.py").write_text(NET)
    assert main(["calibrate", "--model", f"{root / 'net.py'}:make", "--data", "synthetic",
                 "--image-size", "16", "--num-batches", "1", "--batch-size", "8",
                 "--limit-batches", "1", "--no-progress", "--method", "max",
                 "--out", str(root / "ptq")]) == 0
    return root / "ptq"


@pytest.mark.parametrize("extra, needle", [
    (["--input-names", "a,b"], "--input-names gives 2 name(s) (a, b) for a model with 1 input"),
    (["--output-names", "a,b"], "--output-names gives 2 name(s) (a, b) for a model with 1 "
                                "output"),
    (["--batch", "9999999999"], "--batch/--image-size 16x16 needs 30.7 TB for the example "
                                "batch (9999999999 x 3 x 16 x 16 x 4 bytes)"),
])
def test_export_values_the_model_refuses_are_one_line(ptq, tmp_path, capsys, extra, needle):
    out = tmp_path / "export"
    rc, err = run_cli(capsys, ["export", "-c", str(ptq), "--variant", "fp32", "--out", str(out),
                               "--val-batches", "1", *extra])
    one_error_line(rc, err, needle)
    assert not out.exists()  # refused before the folder is made


@pytest.mark.parametrize("samples", [1, 9])
def test_calibration_takes_an_array_smaller_than_or_one_past_a_batch(tmp_path, capsys, samples):
    """A one-sample .npy (and 9 samples at batch 8, a last batch of one) calibrates: the batch
    is clipped to the samples and no last batch is dropped (no BatchNorm training here)."""
    import numpy as np

    from trtqat.runs.checkpoint import load_checkpoint

    (tmp_path / "net.py").write_text(NET)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((samples, 3, 16, 16),
                                                               dtype=np.float32))
    out = tmp_path / "ptq"
    rc, err = run_cli(capsys, ["calibrate", "--model", f"{tmp_path / 'net.py'}:make", "--data",
                               str(tmp_path / "x.npy"), "--image-size", "16", "--batch-size",
                               "8", "--no-progress", "--method", "max", "--out", str(out)])
    assert rc == 0, err
    state = load_checkpoint(out / "best.pt")["state_dict"]
    assert float(state["0._input_quantizer._amax"].max()) > 0

"""``--format``/``--block-size`` of calibrate and qat: recorded in the checkpoints, re-applied
by the families when they rebuild the model, one-line errors for what a format cannot do."""

from __future__ import annotations

import pytest
import torch

from trtqat import families
from trtqat.cli import main
from trtqat.quant.descriptor import E4M3
from trtqat.quant.model_ops import quantizers

TINY = ["--limit-batches", "2", "--batch-size", "8", "--no-progress", "--device", "cpu"]


def _fails(argv, capsys, match):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert match in err, err


def _formats(path) -> tuple[str | None, set]:
    ckpt = torch.load(path, weights_only=True)
    model = families.build_from_checkpoint(ckpt)
    return ckpt["model"].get("format"), {q.num_bits for _, q in quantizers(model)}


def test_fp8_calibrate_then_qat(fp32_run, tmp_path, capsys):
    ptq, qat = tmp_path / "ptq", tmp_path / "qat"
    assert main(["calibrate", "-c", str(fp32_run), "--format", "fp8", "--num-batches", "2",
                 "--out", str(ptq), *TINY]) == 0
    assert _formats(ptq / "best.pt") == ("fp8", {E4M3})
    assert main(["qat", "-c", str(ptq), "--epochs", "1", "--out", str(qat), *TINY]) == 0
    assert _formats(qat / "best.pt") == ("fp8", {E4M3})
    ckpt = torch.load(qat / "best.pt", weights_only=True)
    amax = [v for k, v in ckpt["state_dict"].items() if k.endswith("_amax")]
    assert amax and all(bool(torch.isfinite(a).all()) for a in amax)
    capsys.readouterr()
    out = tmp_path / "refused"
    _fails(["qat", "-c", str(ptq), "--format", "int8", "--out", str(out)], capsys,
           "calibrated as fp8, not int8")
    _fails(["qat", "-c", str(ptq), "--block-size", "32", "--out", str(out)], capsys,
           "--block-size goes with int4")
    assert not out.exists()


def test_old_checkpoints_are_int8(ptq_run, tmp_path):
    ckpt = torch.load(ptq_run / "best.pt", weights_only=True)
    assert ckpt["model"]["format"] == "int8"  # recorded now
    del ckpt["model"]["format"]  # written before formats
    model = families.build_from_checkpoint(ckpt)
    assert {q.num_bits for _, q in quantizers(model)} == {8}


@pytest.mark.parametrize("argv, match", [
    (["--format", "fp8", "--method", "entropy"], "no FP8 form"),
    (["--format", "fp8", "--block-size", "64"], "--block-size goes with --format int4"),
    (["--format", "fp4"], "invalid choice"),
])
def test_calibrate_format_errors(fp32_run, tmp_path, capsys, argv, match):
    out = tmp_path / "run"
    if match == "invalid choice":  # argparse's own refusal: usage and exit code 2
        with pytest.raises(SystemExit) as exc:
            main(["calibrate", "-c", str(fp32_run), *argv, "--out", str(out)])
        assert exc.value.code == 2 and match in capsys.readouterr().err
    else:
        _fails(["calibrate", "-c", str(fp32_run), *argv, "--out", str(out)], capsys, match)
    assert not out.exists()

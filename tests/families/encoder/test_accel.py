"""The encoder verbs take --amp, --channels-last, --compile and --device like the CNN ones."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from trtqat.cli import main
from trtqat.families import build_from_checkpoint
from trtqat.runs import accel
from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.run_dir import read_metrics

FAST = ["--max-length", "16", "--batch-size", "4", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory) -> dict:
    """PTQ with --amp bf16 --channels-last --compile, then 2 QAT steps with bf16 + compile.

    --compile traces with dynamo's eager backend (no code generation) to stay fast; every
    object handed to torch.compile is recorded.
    """
    root = tmp_path_factory.mktemp("accel") / "tiny"
    compiled: list = []
    real = torch.compile
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(accel, "COMPILE_BACKEND", "eager")
            mp.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or real(fn, **kw))
            rc_ptq = main(["calibrate", "--model", str(tiny_dir), "--method", "max",
                           "--num-sentences", "8", "--out", str(root / "ptq"), "--amp", "bf16",
                           "--channels-last", "--compile", *FAST])
            rc_qat = main(["qat", "-c", str(root / "ptq"), "--max-steps", "2",
                           "--out", str(root / "qat"), "--amp", "bf16", "--compile", *FAST])
    finally:
        torch.set_num_threads(n)
    return {"root": root, "rc": (rc_ptq, rc_qat), "compiled": compiled}


def test_encoder_ptq_and_qat_accept_the_options(runs):
    assert runs["rc"] == (0, 0)
    names = [getattr(fn, "__name__", type(fn).__name__) for fn in runs["compiled"]]
    assert "SentenceEncoder" in names  # the evaluation forward
    assert "distillation_loss" in names  # the QAT step (student and teacher)
    for stage in ("ptq", "qat"):
        folder = runs["root"] / stage
        args = yaml.safe_load((folder / "args.yaml").read_text())
        assert args["amp"] == "bf16" and args["compile"] is True
        ckpt = load_checkpoint(folder / "best.pt")
        assert not any("_orig_mod" in k for k in ckpt["state_dict"])
        assert all(v.dtype == torch.float32 for v in ckpt["state_dict"].values()
                   if v.is_floating_point())
        assert isinstance(build_from_checkpoint(ckpt), nn.Module)  # strict key check inside
        rec = read_metrics(folder)[-1]
        assert 0.0 < rec["mean_cosine"] <= 1.0
    qat = read_metrics(runs["root"] / "qat")[-1]
    assert qat["step"] == 2 and qat["loss_first"] == qat["loss_first"]  # finite, not NaN


def _fails(argv, capsys, match):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err


def test_encoder_bad_device_and_precision(runs, tiny_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _fails(["calibrate", "--model", str(tiny_dir), "--out", str(out), "--device", "cuda"],
           capsys, "no CUDA GPU is visible")
    _fails(["qat", "-c", str(runs["root"] / "ptq"), "--out", str(out), "--device", "cuda"],
           capsys, "no CUDA GPU is visible")
    _fails(["qat", "-c", str(runs["root"] / "ptq"), "--out", str(out), "--amp", "fp16"],
           capsys, "--amp fp16 needs a CUDA GPU")
    assert not out.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_encoder_ptq_and_qat_on_cuda(tiny_dir, tmp_path):
    root = tmp_path / "gpu"
    cuda = ["--max-length", "16", "--batch-size", "4", "--no-progress", "--device", "cuda"]
    assert main(["calibrate", "--model", str(tiny_dir), "--num-sentences", "8", "--out",
                 str(root / "ptq"), "--amp", "fp16", *cuda]) == 0
    assert main(["qat", "-c", str(root / "ptq"), "--max-steps", "2", "--out",
                 str(root / "qat"), "--amp", "fp16", *cuda]) == 0
    ckpt = load_checkpoint(root / "qat" / "best.pt")
    assert all(v.device.type == "cpu" and v.dtype == torch.float32
               for v in ckpt["state_dict"].values() if v.is_floating_point())

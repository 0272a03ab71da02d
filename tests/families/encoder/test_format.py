"""Encoders in FP8: calibrated_copy applies the format, the checkpoint records it, and a
rebuild from the checkpoint gets the same quantizers and embeddings."""

from __future__ import annotations

import pytest
import torch

from trtqat.families.encoder.checkpoint import build_encoder_from_checkpoint, encoder_spec
from trtqat.families.encoder.minilm import embed
from trtqat.families.encoder.recipes import CalibOptions, calibrated_copy
from trtqat.families.quant_format import record_format
from trtqat.quant.descriptor import E4M3
from trtqat.quant.model_ops import quantizers
from trtqat.runopts import ConfigError


def test_fp8_encoder_round_trip(tiny_dir, tiny, sentences):
    model, tok = tiny
    q = calibrated_copy(model, tok, sentences, CalibOptions(format="fp8", max_length=32))
    assert {qz.num_bits for _, qz in quantizers(q)} == {E4M3}
    spec = record_format(encoder_spec(tiny_dir, quantized=True, max_length=32), "fp8")
    back, _ = build_encoder_from_checkpoint({"model": spec, "state_dict": q.state_dict()})
    assert {qz.num_bits for _, qz in quantizers(back)} == {E4M3}
    assert torch.equal(embed(back, tok, sentences, max_length=32),
                       embed(q, tok, sentences, max_length=32))
    spec.pop("format")  # a checkpoint written before formats: int8
    old, _ = build_encoder_from_checkpoint({"model": spec, "state_dict": q.state_dict()})
    assert {qz.num_bits for _, qz in quantizers(old)} == {8}


def test_encoder_calib_options_check_the_format():
    with pytest.raises(ConfigError, match="no FP8 form"):
        CalibOptions(format="fp8", method="entropy")
    with pytest.raises(ConfigError, match="unknown --format"):
        CalibOptions(format="fp4")


def test_fp8_encoder_qat_learns_its_ranges(tiny, sentences):
    """The encoder QAT recipe (distillation, learned activation ranges) runs on an FP8
    student: the ranges move and stay finite."""
    from trtqat.families.encoder.recipes import EncoderQATConfig, qat_encoder

    teacher, tok = tiny
    student = calibrated_copy(teacher, tok, sentences,
                              CalibOptions(format="fp8", method="max", max_length=32))
    before = {n: q.amax.clone() for n, q in quantizers(student) if q.axis is None}
    hist = qat_encoder(student, teacher, tok, sentences, EncoderQATConfig(
        max_steps=3, epochs=3, batch_size=4, max_length=32, learn_amax=True, amax_lr=0.05))
    assert hist["steps"] == 3 and all(torch.isfinite(torch.tensor(hist["loss"])))
    learned = {n: q.amax for n, q in quantizers(student) if q.learn_amax}
    assert learned and all(bool(torch.isfinite(a).all()) for a in learned.values())
    assert any(not torch.equal(a, before[n]) for n, a in learned.items() if n in before)


def test_encoder_cli_calibrate_and_qat_in_fp8(tiny_dir, sentences, tmp_path):
    from trtqat.cli import main
    from trtqat.runs.checkpoint import load_checkpoint

    text = tmp_path / "sentences.txt"
    words = " ".join(sentences).lower().replace(".", "").split()
    lines = [" ".join(words[i:i + 3 + i % 7]) + "." for i in range(48)]  # distinct ones
    text.write_text("\n".join(lines) + "\n")
    fast = ["--max-length", "24", "--batch-size", "8", "--no-progress"]
    assert main(["calibrate", "--model", str(tiny_dir), "--data", str(text), "--format", "fp8",
                 "--num-sentences", "16", "--out", str(tmp_path / "ptq"), *fast]) == 0
    assert main(["qat", "-c", str(tmp_path / "ptq"), "--max-steps", "2",
                 "--out", str(tmp_path / "qat"), *fast]) == 0
    for run in ("ptq", "qat"):
        ckpt = load_checkpoint(tmp_path / run / "best.pt")
        assert ckpt["model"]["format"] == "fp8", run
        model, _ = build_encoder_from_checkpoint(ckpt)
        assert {q.num_bits for _, q in quantizers(model)} == {E4M3}, run
    assert "format" not in load_checkpoint(tmp_path / "fp32" / "best.pt")["model"]

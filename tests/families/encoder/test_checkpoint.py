"""Encoder checkpoints: trtqat format, weights_only load, quantized round trip."""

from __future__ import annotations

import pytest
import torch
from tiny_bert import calibrated_encoder

from trtqat.families.encoder.checkpoint import (
    build_encoder_from_checkpoint,
    encoder_spec,
    is_encoder_checkpoint,
    load_encoder_checkpoint,
    save_encoder_checkpoint,
)
from trtqat.families.encoder.minilm import embed
from trtqat.runs.checkpoint import CheckpointError, load_checkpoint


def test_quantized_round_trip(tiny_dir, tiny, sentences, tmp_path):
    model, tok = tiny
    q = calibrated_encoder(model, tok, sentences, max_length=32)
    spec = encoder_spec(tiny_dir, quantized=True, max_length=32)
    path = save_encoder_checkpoint(tmp_path / "ptq.pt", q, stage="ptq", spec=spec,
                                   metrics={"mean_cosine": 0.99})
    ckpt = load_checkpoint(path)  # the trtqat loader (weights_only=True) reads it
    assert ckpt["stage"] == "ptq" and is_encoder_checkpoint(ckpt)
    assert ckpt["model"]["arch"] == str(tiny_dir) and ckpt["model"]["quantized"] is True
    back, tok2, _ = load_encoder_checkpoint(path)
    assert torch.equal(embed(back, tok2, sentences, max_length=32),
                       embed(q, tok, sentences, max_length=32))
    fp32, _ = build_encoder_from_checkpoint(ckpt, quantized=False)
    assert torch.allclose(embed(fp32, tok, sentences, max_length=32),
                          embed(model, tok, sentences, max_length=32))


def test_fp32_checkpoint_starts_ptq(tiny_dir, tiny, tmp_path):
    model, _ = tiny
    path = save_encoder_checkpoint(tmp_path / "fp32.pt", model, stage="fp32",
                                   spec=encoder_spec(tiny_dir))
    q, _, _ = load_encoder_checkpoint(path, quantized=True)
    assert any(n.endswith("matmul_qk") for n, _ in q.named_modules())


def test_wrong_checkpoints_are_refused(tiny_dir, tiny, tmp_path):
    with pytest.raises(CheckpointError, match="not an encoder"):
        build_encoder_from_checkpoint({"model": {"arch": "resnet18"}, "state_dict": {}})
    model, _ = tiny
    spec = encoder_spec(tiny_dir)
    state = {"backbone.extra.weight": torch.zeros(1), **model.state_dict()}
    with pytest.raises(CheckpointError, match="mismatched"):
        build_encoder_from_checkpoint({"model": spec, "state_dict": state})
    with pytest.raises(ValueError, match="stage"):
        save_encoder_checkpoint(tmp_path / "x.pt", model, stage="train", spec=spec)


def test_qat_checkpoint_with_learned_ranges(tiny_dir, tiny, sentences, tmp_path):
    from trtqat.families.encoder.recipes import EncoderQATConfig, qat_encoder

    model, tok = tiny
    q = calibrated_encoder(model, tok, sentences, max_length=32)
    qat_encoder(q, model, tok, sentences, EncoderQATConfig(max_steps=1, batch_size=4,
                                                           max_length=32, learn_amax=True))
    path = save_encoder_checkpoint(tmp_path / "qat.pt", q, stage="qat",
                                   spec=encoder_spec(tiny_dir, quantized=True, max_length=32))
    back, _, _ = load_encoder_checkpoint(path)
    assert torch.equal(embed(back, tok, sentences, max_length=32),
                       embed(q, tok, sentences, max_length=32))

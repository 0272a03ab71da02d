"""PTQ and QAT verbs on the tiny encoder: each calibrator, distillation lowers the loss."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_bert import calibrated_encoder

from trtqat.errors import QuantizerStateError
from trtqat.families.encoder.minilm import embed, tokenize
from trtqat.families.encoder.recipes import (
    CalibOptions,
    EncoderCalibConfig,
    EncoderConfigError,
    EncoderQATConfig,
    calibrate_encoder,
    calibrated_copy,
    collect_encoder_stats,
    distillation_loss,
    qat_encoder,
    quantized_copy,
    set_amax,
)
from trtqat.quant.model_ops import quantizers
from trtqat.stages.calibrate import CalibrateConfig

MAX_LEN = 32


def test_calibrate_encoder_every_method(tiny, sentences):
    model, tok = tiny
    q = calibrated_copy(model, tok, sentences, CalibrateConfig(
        method="max", batch_size=4, max_length=MAX_LEN))
    assert not any(True for _ in quantizers(model))  # the FP32 model is untouched
    name = "backbone.encoder.layer.1.attention.self.matmul_av._input_quantizer"
    amax = {}
    for method in ("max", "percentile", "mse", "entropy"):
        set_amax(q, method, 99.9)
        amax[method] = float(dict(quantizers(q))[name].amax)
        out = embed(q, tok, sentences, max_length=MAX_LEN)
        assert torch.isfinite(out).all()
    assert amax["max"] <= 1.0 + 1e-6  # softmax probabilities
    assert len(set(amax.values())) > 1  # the methods really differ


def test_qat_lowers_the_distillation_loss(tiny, sentences):
    teacher, tok = tiny
    student = calibrated_encoder(teacher, tok, sentences, max_length=MAX_LEN, batch_size=8)
    with torch.no_grad():  # a random tiny BERT barely moves under INT8: start it off target
        for name, p in student.named_parameters():
            if name.endswith("dense.weight"):
                p.add_(0.05 * torch.randn_like(p))
    batch = tokenize(tok, sentences, MAX_LEN)
    with torch.no_grad():
        before = float(distillation_loss(student, teacher, batch))
    weights = copy.deepcopy(teacher.state_dict())
    hist = qat_encoder(student, teacher, tok, sentences, EncoderQATConfig(
        epochs=8, batch_size=8, max_length=MAX_LEN, lr=3e-4, warmup_ratio=0.0, learn_amax=False))
    with torch.no_grad():
        after = float(distillation_loss(student, teacher, batch))
    assert hist["steps"] == 8 and len(hist["loss"]) == 8 and len(hist["lr"]) == 8
    assert hist["lr"][-1] < hist["lr"][0]  # cosine annealing
    assert after < 0.5 * before, (before, after)
    for k, v in teacher.state_dict().items():  # the teacher stays frozen
        assert torch.equal(v, weights[k]), k


def test_qat_mse_loss_and_learned_amax(tiny, sentences):
    teacher, tok = tiny
    student = calibrated_encoder(teacher, tok, sentences, max_length=MAX_LEN, batch_size=8)
    hist = qat_encoder(student, teacher, tok, sentences, EncoderQATConfig(
        max_steps=2, epochs=5, batch_size=4, max_length=MAX_LEN, loss="mse", learn_amax=True))
    assert hist["steps"] == 2
    learned = [q for _, q in quantizers(student) if q.learn_amax]
    assert learned and all(q.axis is None for q in learned)
    # query/key/value read one tensor: they learned one range (TensorRT fuses them then)
    blocks = [m for m in student.modules() if hasattr(m, "query") and hasattr(m, "value")]
    assert blocks
    for b in blocks:
        ranges = [getattr(b, n)._input_quantizer.amax for n in ("query", "key", "value")]
        assert ranges[0].item() > 0 and all(torch.equal(r, ranges[0]) for r in ranges)


def test_qat_refuses_an_uncalibrated_student(tiny, sentences):
    teacher, tok = tiny
    with pytest.raises(QuantizerStateError, match="calibrate"):
        qat_encoder(quantized_copy(teacher), teacher, tok, sentences,
                    EncoderQATConfig(batch_size=4))
    with pytest.raises(QuantizerStateError, match="no enabled quantizer"):
        qat_encoder(copy.deepcopy(teacher), teacher, tok, sentences,
                    EncoderQATConfig(batch_size=4))


def test_collect_needs_sentences(tiny):
    model, tok = tiny
    with pytest.raises(EncoderConfigError, match="at least one"):
        collect_encoder_stats(quantized_copy(model), tok, [])


def test_the_encoder_only_calibration_verb_still_works_but_is_deprecated(tiny, sentences):
    model, tok = tiny
    with pytest.warns(DeprecationWarning, match=r"EncoderCalibConfig is deprecated.*quantize"):
        cfg = EncoderCalibConfig(method="max", batch_size=4, max_length=MAX_LEN)
    with pytest.warns(DeprecationWarning, match=r"calibrate_encoder is deprecated.*quantize"):
        q = calibrate_encoder(model, tok, sentences, cfg)
    qs = [q for _, q in quantizers(q) if not q.disabled]
    assert qs and all(q.amax is not None for q in qs)
    with pytest.warns(DeprecationWarning), pytest.raises(EncoderConfigError, match="--method"):
        EncoderCalibConfig(method="kl")


@pytest.mark.parametrize("cls,kwargs,match", [
    (CalibOptions, {"method": "kl"}, "unknown --method"),  # trtqat calibrate's config
    (CalibOptions, {"percentile": 0}, "percentile"),
    (CalibOptions, {"batch_size": 0}, "--batch-size"),
    (EncoderQATConfig, {"loss": "l1"}, "unknown loss"),
    (EncoderQATConfig, {"lr": -1.0}, "lr"),
    (EncoderQATConfig, {"warmup_ratio": 1.0}, "warmup_ratio"),
])
def test_configs_are_checked(cls, kwargs, match):
    with pytest.raises(EncoderConfigError, match=match):
        cls(**kwargs)

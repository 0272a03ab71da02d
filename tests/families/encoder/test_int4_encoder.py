"""INT4 block-wise weights on the tiny encoder: the family's QAT learns the block amax."""

from __future__ import annotations

import copy

import torch

from trtqat.families.encoder.minilm import tokenize
from trtqat.families.encoder.recipes import (
    EncoderQATConfig,
    collect_encoder_stats,
    distillation_loss,
    qat_encoder,
    quantized_copy,
    set_amax,
)
from trtqat.quant.blockwise import is_block, to_int4_weights
from trtqat.quant.model_ops import quantizers


def test_encoder_qat_learns_the_int4_block_amax(tiny, sentences):
    teacher, tok = tiny
    student = quantized_copy(teacher)
    assert to_int4_weights(student, 32) == 12  # 2 layers x (q, k, v, out, up, down)
    collect_encoder_stats(student, tok, sentences, 8, 32)
    set_amax(student, "mse")
    blocks = {n: q for n, q in quantizers(student) if is_block(q)}
    assert set(blocks) == {n for n, q in quantizers(student) if not q.disabled}
    for q in blocks.values():  # start the ranges off target: clipping half of each block
        q.amax = q.amax * 0.5
    start = {n: q.amax.clone() for n, q in blocks.items()}
    batch = tokenize(tok, sentences, 32)
    with torch.no_grad():
        before = float(distillation_loss(student, teacher, batch))
    weights = copy.deepcopy(student.state_dict())
    qat_encoder(student, teacher, tok, sentences, EncoderQATConfig(
        epochs=6, batch_size=8, max_length=32, lr=1e-9, amax_lr=1e-2, warmup_ratio=0.0))
    assert all(q.learn_amax for q in blocks.values())
    assert any(not torch.equal(q.amax, start[n]) for n, q in blocks.items())
    with torch.no_grad():
        after = float(distillation_loss(student, teacher, batch))
    assert after < 0.8 * before, (before, after)
    moved = [k for k, v in student.state_dict().items()
             if not k.endswith("_amax") and not torch.allclose(v, weights[k], atol=1e-6)]
    assert not moved  # lr 1e-9: the ranges alone lowered the loss

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


def test_int4_embedding_tables_are_recorded_and_rebuilt(tiny):
    import pytest

    from trtqat.errors import QuantConfigError
    from trtqat.families.quant_format import apply_spec_format, record_format, with_format
    from trtqat.quant.blockwise import Int4Embedding
    from trtqat.quant.config import QuantConfig
    from trtqat.runs.format_options import check_format_options
    from trtqat.runs.recipes import ConfigError

    teacher, _ = tiny
    spec = record_format({}, "int4", 32, embeddings=True)
    assert spec == {"format": "int4", "block_size": 32, "int4_embeddings": True}
    assert "int4_embeddings" not in record_format(dict(spec), "fp8")  # only int4 has tables
    ckpt = with_format({"model": {"arch": "m"}}, "int4", 64, embeddings=True)
    assert ckpt["model"]["int4_embeddings"] and ckpt["model"]["block_size"] == 64
    rebuilt = apply_spec_format(quantized_copy(teacher), spec)
    tables = [m for m in rebuilt.modules() if isinstance(m, Int4Embedding)]
    assert tables and all(isinstance(m, Int4Embedding) for m in rebuilt.modules()
                          if isinstance(m, torch.nn.Embedding))
    plain = apply_spec_format(quantized_copy(teacher), record_format({}, "int4", 32))
    assert not any(isinstance(m, Int4Embedding) for m in plain.modules())
    with pytest.raises(QuantConfigError, match="int4_embeddings goes with format 'int4'"):
        QuantConfig(int4_embeddings=True)
    with pytest.raises(ConfigError, match="--int4-embeddings goes with --format int4"):
        check_format_options(type("C", (), {"format": "fp8", "block_size": None,
                                            "int4_embeddings": True})())

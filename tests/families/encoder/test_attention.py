"""Attention wiring: quantizers on both operands of both matmuls, float path bit-exact."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.families.encoder.minilm import load_backbone, tokenize
from trtqat.quant.model_ops import quantizers
from trtqat.quant.modules import QuantLinear
from trtqat.quant.plugins.attention import (
    ATTN_IMPLEMENTATION,
    attention_modules,
    quant_matmuls,
)
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.plugins.transformer import quantize_transformer


def test_every_attention_gets_two_quant_matmuls(tiny):
    model, _ = tiny
    quantize_transformer(model)
    attn = dict(attention_modules(model))
    assert len(attn) == 2  # one self-attention per layer
    for m in attn.values():
        assert isinstance(m.matmul_qk, QuantMatMul) and isinstance(m.matmul_av, QuantMatMul)
    assert model.backbone.config._attn_implementation == ATTN_IMPLEMENTATION
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, QuantLinear) for m in linears)
    for name, q in quantizers(model):
        if name.endswith("_weight_quantizer"):
            assert q.axis == 0  # Linear weights per row (stored as given: axis=(0) is 0)
        else:
            assert q.axis is None  # activations (and both matmul operands) per tensor
            assert type(q._calibrator).__name__ == "HistogramCalibrator"


def test_quantizers_see_both_operands_of_both_matmuls(tiny, sentences):
    model, tok = tiny
    quantize_transformer(model)
    seen: dict[str, torch.Size] = {}
    def hook(name):
        return lambda mod, inp, out: seen.__setitem__(name, inp[0].shape)

    hooks = [q.register_forward_hook(hook(name)) for name, q in quantizers(model)
             if ".matmul_" in name]
    for _, q in quantizers(model):
        q.disable_quant()  # no amax yet: pass through, but still call the quantizers
    batch = tokenize(tok, sentences[:3], max_length=32)
    model(**batch)
    for h in hooks:
        h.remove()
    b, n = batch["input_ids"].shape
    heads, d = 4, 8
    layer = "backbone.encoder.layer.0.attention.self"
    assert seen[f"{layer}.matmul_qk._input_quantizer"] == (b, heads, n, d)  # Q
    assert seen[f"{layer}.matmul_qk._other_quantizer"] == (b, heads, d, n)  # K^T
    assert seen[f"{layer}.matmul_av._input_quantizer"] == (b, heads, n, n)  # softmax
    assert seen[f"{layer}.matmul_av._other_quantizer"] == (b, heads, n, d)  # V
    assert len(seen) == 2 * 4


def test_disabled_quantizers_give_the_original_model_exactly(tiny_dir, tiny, sentences):
    model, tok = tiny
    original = load_backbone(tiny_dir)  # the untouched Hugging Face model (eager)
    quantize_transformer(model)
    for _, q in quantizers(model):
        q.disable()
    batch = tokenize(tok, sentences, max_length=32)  # padded: the mask path is exercised
    with torch.no_grad():
        want = original(**batch).last_hidden_state
        got = model.backbone(**batch).last_hidden_state
    assert torch.equal(got, want)
    # and the library's default (SDPA) attention agrees up to rounding
    sdpa = copy.deepcopy(original)
    sdpa.set_attn_implementation("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(sdpa(**batch).last_hidden_state, want, rtol=1e-4, atol=1e-5)


def test_quantizing_a_copy_leaves_the_fp32_model_alone(tiny, sentences):
    model, tok = tiny
    q = quantize_transformer(copy.deepcopy(model))
    assert model.backbone.config._attn_implementation == "eager"
    assert not any(True for _ in quantizers(model))
    assert len(list(quant_matmuls(q))) == 4


def test_skip_layers_keep_the_first_layer_float(tiny):
    model, _ = tiny
    quantize_transformer(model, skip_layers=("backbone.encoder.layer.0.*",))
    names = {n for n, _ in quantizers(model)}
    assert not any(".layer.0.attention.self.query." in n for n in names)
    for name, mm in quant_matmuls(model):
        assert mm.input_quantizer.disabled == (".layer.0." in name)


def test_a_model_without_attention_is_refused():
    with pytest.raises(QuantConfigError, match="BERT-family"):
        quantize_transformer(nn.Sequential(nn.Linear(4, 4)))

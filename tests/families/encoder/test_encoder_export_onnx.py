"""``trtqat.export_onnx`` on a quantized sentence encoder, its tokenizer's output as the
example: the encoder family's plan (batch and sequence dynamic, cosine check), no second
API."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from tiny_bert import calibrated_encoder

import trtqat
from trtqat.export import ExportError

ort = pytest.importorskip("onnxruntime")


def test_a_quantized_encoder_exports_from_its_tokenizers_output(tiny, sentences, tmp_path):
    model, tok = tiny
    qmodel = calibrated_encoder(model, tok, sentences, max_length=32)
    enc = dict(tok(sentences[:1], return_tensors="pt"))  # one sentence: traced as two rows
    assert list(enc) == ["input_ids", "token_type_ids", "attention_mask"]  # not forward's order
    result = trtqat.export_onnx(qmodel, enc, tmp_path / "enc-int8.onnx", "int8")
    assert result.passed and result.lint is not None and result.lint.ok
    assert result.dynamic_axes == ("batch", "sequence")
    length = enc["input_ids"].shape[1]
    cosine = next(c for c in result.checks if "cosine" in c.detail)
    assert f"at batch x sequence 2x{length}, 1x{length // 2}" in cosine.detail  # two shapes
    graph = onnx.load(str(result.path))
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask",
                                                   "token_type_ids"]
    assert all([d.dim_param for d in i.type.tensor_type.shape.dim] == ["batch", "sequence"]
               for i in graph.graph.input)
    meta = {p.key: p.value for p in graph.metadata_props}
    assert meta["trtqat.family"] == "encoder" and meta["trtqat.task"] == "sentence-embedding"
    # another batch and length than the example, through ONNX Runtime
    other = tok(sentences[3:8], padding=True, truncation=True, max_length=7, return_tensors="pt")
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    [got] = session.run(None, {k: v.numpy() for k, v in other.items()})
    with torch.no_grad():
        want = qmodel(**other).numpy()
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert got.shape == (5, 32) and cos.min() > 0.99


def test_encoder_inputs_are_token_tensors_and_both_axes_stay_dynamic(tiny, tmp_path):
    model, tok = tiny
    enc = dict(tok(["a short one"], return_tensors="pt"))
    with pytest.raises(ExportError, match="batch and sequence dynamic"):
        trtqat.export_onnx(model, enc, tmp_path / "x.onnx", "fp32", dynamic_batch=False)
    with pytest.raises(ExportError, match="tokenizer's int64"):
        trtqat.export_onnx(model, {"input_ids": torch.randn(1, 4),
                                   "attention_mask": torch.ones(1, 4)}, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()

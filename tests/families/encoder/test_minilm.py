"""The packaged all-MiniLM-L6-v2: offline loading, sentence-transformers parity, PTQ."""

from __future__ import annotations

import socket

import pytest
import torch

from trtqat.families.encoder.metrics import embedding_fidelity
from trtqat.families.encoder.minilm import ModelNotFoundError, embed, load_encoder, model_dir
from trtqat.families.encoder.recipes import collect_encoder_stats, quantized_copy, set_amax


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    mp = pytest.MonkeyPatch()

    def no_network(*args, **kwargs):
        raise AssertionError("loading the model tried to open a network connection")

    mp.setattr(socket.socket, "connect", no_network)
    try:
        yield load_encoder("minilm")
    finally:
        mp.undo()


def test_loads_offline_and_matches_sentence_transformers(minilm, minilm_dir, sentences):
    model, tok = minilm
    assert model.backbone.config.hidden_size == 384
    assert model.backbone.config._attn_implementation == "eager"
    got = embed(model, tok, sentences, max_length=32)
    assert got.shape == (len(sentences), 384)
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(sentences)))
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu", local_files_only=True)
    ref.max_seq_length = 32
    want = ref.encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(got, want.cpu(), rtol=1e-4, atol=1e-5)


def test_ptq_gives_finite_embeddings_close_to_fp32(minilm, sentences):
    model, tok = minilm
    ref = embed(model, tok, sentences, max_length=32)
    q = quantized_copy(model)
    collect_encoder_stats(q, tok, sentences, batch_size=4, max_length=32)
    # mse is exercised on the tiny model (tests/families/encoder/test_recipes.py): it costs seconds per model here
    for method, pct in (("max", None), ("percentile", 99.99), ("entropy", None)):
        set_amax(q, method, pct or 99.99)
        out = embed(q, tok, sentences, max_length=32)
        assert torch.isfinite(out).all()
        fid = embedding_fidelity(ref, out)
        assert fid["mean_cosine"] > 0.8, (method, pct, fid)
        assert fid["mean_cosine"] < 1.0 - 1e-6  # quantization is really on


def test_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        model_dir(tmp_path)

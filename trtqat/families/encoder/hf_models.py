"""What makes an in-memory model an encoder: what it is, not how it was built.

A ``transformers`` ``PreTrainedModel`` whose config is neither a decoder nor an
encoder-decoder, and whose architecture is not decoder-only (GPT-2, Llama): ``BertModel``,
``DistilBertModel``, ``RobertaModel``, ``ViTModel``, ..., from ``from_config`` or
``from_pretrained``; or any other module whose ``forward`` takes ``input_ids`` first.
Imports neither transformers (a model of it means it is imported) nor onnx.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from torch import nn


def is_hf_encoder(model: Any) -> bool:
    """True for a ``transformers.PreTrainedModel`` that is an encoder (not a decoder, not an
    encoder-decoder, not of a decoder-only architecture); False without transformers."""
    transformers = sys.modules.get("transformers")  # a model of it means it is imported
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return False
    return is_encoder_config(model.config)


def is_encoder_config(config: Any) -> bool:
    """True for the config (a ``PretrainedConfig`` or ``config.json``'s dict) of an encoder:
    neither a decoder nor an encoder-decoder, nor of a decoder-only architecture."""
    def get(key: str) -> Any:
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    if get("is_decoder") or get("is_encoder_decoder"):
        return False
    from transformers.models.auto import modeling_auto

    kind = get("model_type") or ""
    decoder_only = (kind in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                    and kind not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    return not decoder_only


def forward_params(model: nn.Module) -> list[str]:
    """The names of ``model.forward``'s explicit arguments, in order."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def takes_token_ids(model: nn.Module) -> bool:
    """True when ``model.forward`` takes ``input_ids`` first (a token model); a
    ``transformers`` model only when :func:`is_hf_encoder`."""
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        return is_hf_encoder(model)
    return forward_params(model)[:1] == ["input_ids"]


__all__ = ["forward_params", "is_encoder_config", "is_hf_encoder", "takes_token_ids"]

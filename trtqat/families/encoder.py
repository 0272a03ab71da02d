"""BERT-style sentence encoders (MiniLM, Hugging Face folders): self-distilled, cosine-checked."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from trtqat.families.base import ExportInputs, ModelFamily


class EncoderFamily(ModelFamily):
    """Sentence encoders: mean-pooled embeddings, checked by cosine against FP32."""

    name = "encoder"
    checkpoint_tag = "transformer"  # the tag every encoder checkpoint carries
    task = "embedding"
    summary = "sentence encoders: 'minilm' or a Hugging Face BERT-family folder"

    def claims_model(self, model: str) -> bool:
        """``minilm`` or a folder (a Hugging Face model); never a ``file.py:factory``."""
        from trtqat.transformers.minilm import MINILM

        if not model or ".py" in model:
            return False
        return model == MINILM or "/" in model or Path(model).expanduser().is_dir()

    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """The FP32 encoder ``model`` names (its tokenizer: ``load_encoder``)."""
        from trtqat.transformers.minilm import load_encoder

        return load_encoder(model)[0]

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The encoder of a checkpoint, with its weights."""
        from trtqat.transformers.checkpoint import build_encoder_from_checkpoint

        return build_encoder_from_checkpoint(ckpt, quantized)[0]

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
        """Linear layers and the attention matmuls, in place."""
        from trtqat.transformers.attention import quantize_transformer

        return quantize_transformer(model, skip_layers=tuple(skip_layers))

    # The hooks below are filled in by the family restructuring (issue 18).
    def data(self, cfg: Any, split: str) -> Iterable[Any]:
        raise NotImplementedError

    def recipe(self, cfg: Any) -> dict[str, Any]:
        raise NotImplementedError

    def metric(self, outputs: Any, targets: Any) -> dict[str, float]:
        raise NotImplementedError

    def export_inputs(self, model: nn.Module, spec: dict[str, Any], batch: int | None
                      ) -> ExportInputs:
        raise NotImplementedError

    def export_check(self, variant: str, reference: Sequence[Any], candidate: Sequence[Any]
                     ) -> tuple[bool, str]:
        raise NotImplementedError

"""CNN image classifiers (torchvision, timm, ``file.py:factory``): the fallback family."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

from trtqat.families.base import ExportInputs, ModelFamily


class CNNFamily(ModelFamily):
    """Image classifiers trained with cross-entropy, checked by top-1 agreement."""

    name = "cnn"
    task = "classification"
    summary = "image classifiers: torchvision or timm names, or path/to/file.py:factory"

    def claims_model(self, model: str) -> bool:
        """Every model no earlier family claims."""
        return True

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        """Checkpoints without a family tag (every CNN checkpoint ever written) or tagged cnn."""
        return (ckpt.get("model") or {}).get("family") in (None, self.name)

    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """A float model from a torchvision/timm name or ``file.py:factory``."""
        from trtqat.train.model_source import build

        return build(model, num_classes)

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The model of a CNN checkpoint, with its weights."""
        from trtqat.train.checkpoint import build_from_checkpoint

        return build_from_checkpoint(ckpt, quantized)

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
        """Quant* layers in place (activations histogram-calibrated); ``skip_layers`` float."""
        from trtqat.quant.model_ops import QuantConfig, disable_layers, quantize
        from trtqat.train.models import QUANT_DESC_INPUT

        quantize(model, QuantConfig(quant_desc_input=QUANT_DESC_INPUT))
        if skip_layers:
            disable_layers(model, tuple(skip_layers))
        return model

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

"""A fourth model family that lives outside trtqat: a two-layer perceptron on images.

Used by ``test_plugin_family.py`` to show that a family is one module plus one registry
entry: nothing in the stages, the CLI, export or engines knows about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from trtqat.engines.hints import EngineHints
from trtqat.families.cnn import CNNFamily, fit_checkpoint_state


def _side(size: Any) -> tuple[int, int]:
    if size is None:
        return 16, 16
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class MLPFamily(CNNFamily):
    """``mlp_tiny``: Flatten -> Linear(32) -> ReLU -> Linear(classes); AdamW recipe."""

    name = "mlp"
    summary = "test plug-in: a two-layer perceptron on images"

    def claims_model(self, model: str) -> bool:
        return model == "mlp_tiny"

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        return (ckpt.get("model") or {}).get("family") == self.name

    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        h, w = _side(options.get("image_size"))
        channels = options.get("channels") or 3
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * h * w, 32), nn.ReLU(),
                             nn.Linear(32, num_classes or 10))

    def arch(self, model: str) -> str:
        return model

    def origin(self, model: str) -> dict[str, Any]:
        return {"model": model, "kind": self.name}

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        spec = ckpt["model"]
        quantized = bool(spec.get("quantized")) if quantized is None else quantized
        channels = (spec.get("preprocess") or {}).get("channels")
        model = self.build(spec["arch"], int(spec["num_classes"]),
                           image_size=spec.get("image_size"), channels=channels)
        if quantized:
            self.quantize(model, tuple(spec.get("skip_layers") or ()))
        state = ckpt["state_dict"]
        if not quantized:
            state = {k: v for k, v in state.items() if "_quantizer" not in k}
        fit_checkpoint_state(model, state, spec)
        return model

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
        from trtqat.families.cnn.models import QUANT_DESC_INPUT
        from trtqat.quant.model_ops import QuantConfig, disable_layers, quantize

        quantize(model, QuantConfig(quant_desc_input=QUANT_DESC_INPUT))
        if skip_layers:
            disable_layers(model, tuple(skip_layers))
        return model

    def recipe(self, stage: str, cfg: Any, source: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        if stage == "train":
            return {"opt": "adamw", "lr": 1e-2, "weight_decay": 0.0, "epochs": 2,
                    "batch_size": 16}
        if stage == "calibrate":
            return {"method": "max"}
        return super().recipe(stage, cfg, source)

    def engine_hints(self) -> EngineHints:
        return EngineHints(ort_rewrites=("prequantize_weights", "reencode_uint8",
                                         "quantize_gemm_bias"))

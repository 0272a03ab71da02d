"""FP32 training recipes of the CNN family for the models the shared defaults serve badly.

The shared defaults (:data:`trtqat.runopts.FP32_DEFAULTS`: SGD, lr 0.05, weight decay 5e-4,
15 epochs) train ResNets well on digits. MobileNetV2 with them reached 72.8-94.4 % FP32
top-1 over seeds 10-14 at 32 px (55.0 % on seed 0); with its paper's weight decay (4e-5)
and lr 0.02 it reached 99.72 / 98.33 % on seeds 10 / 11 (``benchmarks/mobile_accuracy.py``).
Command-line options still win over these.
"""

from __future__ import annotations

from typing import Any

MODEL_RECIPES: dict[str, dict[str, Any]] = {
    "mobilenet_v2": {"lr": 0.02, "weight_decay": 4e-5},
}


def train_recipe(model: str | None) -> dict[str, Any]:
    """The FP32 options ``model`` trains with beyond the shared defaults ({} for most)."""
    return dict(MODEL_RECIPES.get((model or "").strip().lower(), {}))


__all__ = ["MODEL_RECIPES", "train_recipe"]

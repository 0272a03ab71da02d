"""FP32 training of an image classifier: ``train_fp32(TrainConfig(...))``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from trtqat.runopts import FP32_DEFAULTS, RunOptions
from trtqat.runs import recipes as R

log = logging.getLogger(__name__)


@dataclass
class TrainConfig(R.ScheduleOptions, R.ImageOptions, RunOptions):
    """Options of ``trtqat train`` (each field is the CLI option of the same name; None
    takes the default in :data:`FP32_DEFAULTS`)."""

    out: str = "runs/fp32"
    num_classes: int | None = None
    weights: str | None = None  # initial weights: a state_dict/checkpoint file or a name
    warmup_epochs: float = 1.0

    def __post_init__(self) -> None:
        from trtqat import families

        family = families.of_model(self.model or FP32_DEFAULTS["model"])
        R.fill_defaults(self, {**FP32_DEFAULTS, **family.recipe("train", self)})
        super().__post_init__()
        R.check_data(self)
        R.check_schedule(self)
        R.check_positive(self, "num_classes", allow_none=True)


def train_fp32(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg.model`` in float on ``cfg.data``; writes ``last.pt``/``best.pt`` in ``cfg.out``.

    The model's family (``trtqat.families.of_model``) runs the stage. Returns ``{"last":
    metrics of the last epoch, "best_top1": ..., "out": run folder, "summary": one line}``.
    """
    from trtqat import families

    family = families.of_model(cfg.model)
    return families.summarized(family, "train", family.run_train(cfg))





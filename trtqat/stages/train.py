"""FP32 training of an image classifier: ``train_fp32(TrainConfig(...))``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtqat.runopts import FP32_DEFAULTS, RunOptions
from trtqat.runs import recipes as R

if TYPE_CHECKING:
    from trtqat.families.types import StageResult

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


def train_fp32(cfg: TrainConfig) -> StageResult:
    """Train ``cfg.model`` in float on ``cfg.data``; writes ``last.pt``/``best.pt`` in ``cfg.out``.

    The model's family (``trtqat.families.of_model``) runs the stage. Returns the
    :class:`StageResult`: ``out`` (run folder), ``last`` (metrics of the last epoch),
    ``best`` (best val top-1 in percent) and ``summary`` (the command's closing line).
    """
    from trtqat import families
    from trtqat.threads import apply_threads

    apply_threads(cfg.threads)
    family = families.of_model(cfg.model)
    return families.summarized(family, "train", family.run_train(cfg))





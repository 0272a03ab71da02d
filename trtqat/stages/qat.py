"""Quantization-aware fine-tuning: ``qat_finetune(QATConfig(checkpoint=...))``.

Default recipe (TensorRT's guidance): about 10% of the FP32 schedule's epochs (at least 1),
starting at 1% of its learning rate, cosine-annealed per iteration down to 1% of that
starting rate. The FP32 run's options travel in the calibrated checkpoint (``train_args``).
BatchNorm stays in training mode, as in standard QAT.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtqat.runopts import RunOptions
from trtqat.runs import recipes as R
from trtqat.runs.format_options import check_format_options

if TYPE_CHECKING:
    from trtqat.families.types import StageResult

log = logging.getLogger(__name__)



@dataclass
class QATConfig(R.ScheduleOptions, R.ImageOptions, RunOptions):
    """Options of ``trtqat qat``, for every model family; None takes the family's recipe
    (``family.recipe("qat", ...)``: for image classifiers derived from the FP32 run, see the
    module doc). ``max_steps`` and ``max_length`` are the encoders' own."""

    checkpoint: str = ""
    out: str = "runs/qat"
    skip_layers: tuple[str, ...] = ()
    max_steps: int | None = None
    max_length: int | None = None
    distill: float | None = None  # detectors: weight of the distillation loss from FP32
    format: str | None = None  # None: the checkpoint's; another than its is refused
    block_size: int | None = None  # int4 checkpoints: must match the checkpoint's

    def __post_init__(self) -> None:
        if not str(self.checkpoint):
            raise R.ConfigError("--checkpoint is required: the best.pt of a `trtqat calibrate` run")
        super().__post_init__()
        R.check_data(self)
        R.check_schedule(self)
        R.check_positive(self, "max_steps", "max_length", allow_none=True)
        R.check_positive(self, "distill", allow_none=True, zero=True)
        check_format_options(self, qat=True)


def qat_finetune(cfg: QATConfig) -> StageResult:
    """Fine-tune the calibrated ``cfg.checkpoint`` with fake quantization; writes the run to
    ``cfg.out``. The checkpoint's family (``trtqat.families``) runs the stage.

    Returns the :class:`StageResult`: ``out``, ``last`` (the last metrics record), ``best``
    and ``before`` (val top-1, or an encoder's held-out mean cosine, after and before) and
    ``summary``. For QAT in your own training loop see :func:`trtqat.qat_recipe`.
    """
    from trtqat import families
    from trtqat.threads import apply_threads

    apply_threads(cfg.threads)

    family, src = families.of_source(cfg.checkpoint, cfg.model)
    if src is not None and (src.get("model") or {}).get("quantized"):
        from trtqat.families.quant_format import check_qat_format

        check_qat_format(cfg, src["model"], str(cfg.checkpoint))
    return families.summarized(family, "qat", family.run_qat(cfg, src))







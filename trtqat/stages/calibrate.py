"""Post-training quantization: ``calibrate(CalibrateConfig(checkpoint=...))``.

Loads an FP32 checkpoint (or any float model: ``CalibrateConfig(model="my.py:make",
weights="my.pt")``, a torchvision or timm name), rebuilds the model with quantizers, collects
statistics on ``num_batches`` training batches (eval transforms; a flat image folder or a
``.npy``/``.npz`` array also works), computes amax with the chosen method, evaluates (when
the data has labels) and writes the calibrated checkpoint. Under torchrun the statistics are merged
across ranks (inside ``collect_stats``), so every rank holds the same amax.

Setting the environment variable ``TRTQAT_AMAX_DUMP=DIR`` makes every rank save its amax to
``DIR/amax_rank<R>.pt`` (used by the multi-process test).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtqat.quant.calib.registry import methods
from trtqat.runopts import RunOptions
from trtqat.runs import recipes as R
from trtqat.runs.format_options import check_format_options

if TYPE_CHECKING:
    from trtqat.families.types import StageResult

log = logging.getLogger(__name__)

CHECKPOINT_REQUIRED = ("--checkpoint is required: the best.pt of a `trtqat train` run (or "
                       "--model NAME|FILE.py:FACTORY [--weights FILE] to start from a float "
                       "model; --model minilm or a Hugging Face folder for an encoder)")


@dataclass
class CalibrateConfig(R.ImageOptions, RunOptions):
    """Options of ``trtqat calibrate``, for every model family.

    None takes the family's default (``--method``: max for CNNs, mse for ViTs and
    encoders, percentile for detectors, for every ``format``) or what the FP32 run recorded
    (data options). ``format`` (``trtqat.formats``) is recorded in the checkpoint.
    ``num_sentences``, ``max_length`` and ``fp32_out`` are the encoders' own.
    """

    checkpoint: str = ""
    out: str = "runs/ptq"
    weights: str | None = None  # with --model and no --checkpoint: the float weights
    num_classes: int | None = None
    method: str | None = None
    percentile: float = 99.99
    num_batches: int = 16
    skip_layers: tuple[str, ...] = ()
    num_sentences: int = 512
    max_length: int | None = None
    fp32_out: str | None = None
    format: str = "int8"  # trtqat.formats: int8, fp8, int4 (recorded in the checkpoint)
    block_size: int | None = None  # int4 only (None: trtqat.formats.DEFAULT_BLOCK_SIZE)
    int4_embeddings: bool = False  # int4 only: the embedding tables too

    def __post_init__(self) -> None:
        self.checkpoint = str(self.checkpoint or "")
        if self.checkpoint and self.weights:
            raise R.ConfigError("--weights goes with --model (a float model), not with "
                                "--checkpoint (which holds its weights)")
        super().__post_init__()
        R.check_data(self)
        R.check_positive(self, "num_batches", "num_sentences")
        R.check_positive(self, "max_length", allow_none=True)
        if self.method is not None and self.method not in methods():
            raise R.ConfigError(f"unknown --method {self.method!r}: use one of "
                                f"{', '.join(methods())}")
        if not 0.0 < self.percentile <= 100.0:
            raise R.ConfigError(f"--percentile must be in (0, 100], got {self.percentile}")
        check_format_options(self)


def calibrate(cfg: CalibrateConfig) -> StageResult:
    """PTQ of ``cfg.checkpoint`` (or of the float ``cfg.model``): writes the "ptq" run.

    The family of the checkpoint or model (``trtqat.families``) runs the stage. Returns the
    :class:`StageResult`: ``out``, ``last`` (the metrics record), ``best`` (val top-1, or
    an encoder's held-out mean cosine) and ``summary``.
    """
    from trtqat import families
    from trtqat.threads import apply_threads

    apply_threads(cfg.threads)

    if not cfg.checkpoint and not cfg.model:
        raise R.ConfigError(CHECKPOINT_REQUIRED)
    family, src = families.of_source(cfg.checkpoint, cfg.model)
    return families.summarized(family, "calibrate", family.run_calibrate(cfg, src))







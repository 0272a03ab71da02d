"""The encoder family's recipes: PTQ with each calibrator, QAT by self-distillation.

* :func:`calibrated_copy` (what ``trtqat calibrate --model minilm`` runs): a quantized copy
  of an FP32 encoder, calibrated on unlabeled sentences. Statistics are collected once
  (histograms for activations, max for weights), so :func:`set_amax` can switch between
  max / percentile / mse / entropy afterwards. In your own code, use the common verbs:
  ``trtqat.quantize(model, forward_loop=...)`` (in memory) or
  ``trtqat.stages.calibrate.calibrate`` (a run folder); :func:`calibrate_encoder` and
  :class:`EncoderCalibConfig`, their encoder-only forerunners, are deprecated.
* :func:`qat_encoder`: fine-tunes a calibrated INT8 student to reproduce the embeddings of
  its FP32 teacher (cosine or MSE loss), AdamW with a linear warm-up and per-step cosine
  annealing to ``final_lr_ratio`` of the starting rate (the recipe of ``trtqat qat``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.errors import QuantizerStateError
from trtqat.families.encoder.minilm import DEFAULT_MAX_LENGTH, batches, tokenize
from trtqat.progress import progress as progress_of
from trtqat.quant.blockwise import is_block
from trtqat.quant.calib.registry import methods
from trtqat.quant.model_ops import collect_stats, compute_amax, quantizers
from trtqat.quant.plugins.transformer import quantize_transformer
from trtqat.runopts import ConfigError, check_positive
from trtqat.runs.accel import Accel
from trtqat.runs.format_options import check_format_options
from trtqat.runs.loop import cosine_lambda

log = logging.getLogger(__name__)

LOSSES = ("cosine", "mse")


EncoderConfigError = ConfigError  # an invalid option of an encoder recipe
DEFAULT_BATCH_SIZE = 32
DEFAULT_METHOD = "mse"  # the best PTQ calibrator on all-MiniLM-L6-v2


DEPRECATED = ("{name} is deprecated: encoders go through the common verbs, "
              "trtqat.quantize(model, forward_loop=...) then trtqat.compute_amax in memory, "
              "or trtqat.stages.calibrate.calibrate(CalibrateConfig(model=...)) for a run")


@dataclass(frozen=True)
class CalibOptions:
    """What :func:`calibrated_copy` reads (``trtqat calibrate``'s ``CalibrateConfig`` has
    the same fields and may be passed instead); None takes the encoder default."""

    method: str | None = None
    percentile: float = 99.99
    num_sentences: int = 512
    batch_size: int | None = None
    max_length: int | None = None
    skip_layers: tuple[str, ...] = ()
    progress: bool = False
    format: str = "int8"  # trtqat.formats
    block_size: int | None = None  # int4's weight block
    int4_embeddings: bool = False  # int4: the embedding tables too

    def __post_init__(self) -> None:
        check_positive(self, "num_sentences")
        check_positive(self, "batch_size", "max_length", allow_none=True)
        check_format_options(self)
        if self.method is not None and self.method not in methods():
            raise ConfigError(f"unknown --method {self.method!r}: use one of "
                              f"{', '.join(methods())}")
        if not 0.0 < self.percentile <= 100.0:
            raise ConfigError(f"--percentile must be in (0, 100], got {self.percentile}")


class EncoderCalibConfig(CalibOptions):
    """Deprecated: ``trtqat.stages.calibrate.CalibrateConfig`` (the same fields), or
    ``trtqat.quantize(model, forward_loop=...)`` in memory."""

    def __post_init__(self) -> None:
        warnings.warn(DEPRECATED.format(name="EncoderCalibConfig"), DeprecationWarning,
                      stacklevel=3)
        super().__post_init__()


def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None or value <= 0:
            raise EncoderConfigError(f"{name} must be > 0, got {value!r}")


def quantized_copy(model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
    """A deep copy of an FP32 encoder with quantizers (uncalibrated); ``model`` is untouched."""
    return quantize_transformer(copy.deepcopy(model), skip_layers=tuple(skip_layers))


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s parameters (where its input batches must go)."""
    return next(model.parameters()).device


def collect_encoder_stats(qmodel: nn.Module, tokenizer, sentences: Sequence[str],
                          batch_size: int = 32, max_length: int = DEFAULT_MAX_LENGTH,
                          progress: bool = False) -> int:
    """Run ``sentences`` through a quantized encoder with calibration on; returns batches seen.

    Batches go to the encoder's device; wrap the call in ``autocast`` for mixed precision.
    """
    if not sentences:
        raise EncoderConfigError("calibration needs at least one sentence")
    loader = list(batches(tokenizer, list(sentences), batch_size, max_length))
    return collect_stats(qmodel, loader, device=model_device(qmodel), progress=progress)


def set_amax(qmodel: nn.Module, method: str, percentile: float = 99.99) -> None:
    """Compute every quantizer's amax from the collected statistics with ``method``."""
    kwargs = {"percentile": percentile} if method == "percentile" else {}
    compute_amax(qmodel, method, **kwargs)


def calibrate_encoder(model: nn.Module, tokenizer, sentences: Sequence[str],
                      config: CalibOptions | Any | None = None, accel: Accel | None = None
                      ) -> nn.Module:
    """Deprecated: :func:`calibrated_copy` does it (``trtqat calibrate``'s code); in your
    own code, ``trtqat.quantize(copy.deepcopy(model), forward_loop=batches)``."""
    warnings.warn(DEPRECATED.format(name="calibrate_encoder"), DeprecationWarning,
                  stacklevel=2)
    return calibrated_copy(model, tokenizer, sentences, config, accel)


def calibrated_copy(model: nn.Module, tokenizer, sentences: Sequence[str],
                    config: CalibOptions | Any | None = None, accel: Accel | None = None
                    ) -> nn.Module:
    """PTQ: a calibrated INT8 (fake-quant) copy of the FP32 encoder ``model``, on its device.

    ``config`` (``trtqat calibrate``'s ``CalibrateConfig``, or :class:`CalibOptions`): ``method`` (activations;
    weights always use max; None: mse, which scores best on all-MiniLM-L6-v2, whose LayerNorm
    outputs have outlier channels that percentile and entropy clip), ``percentile``,
    ``num_sentences`` (taken from the start of the list), ``batch_size`` and ``max_length``
    (tokenization; None: 32 and 128), ``skip_layers`` (glob patterns kept in float).
    ``accel``: its autocast applies to the (always eager) statistics collection.
    ``format``/``block_size`` (``trtqat.formats``; default int8) are applied after placement.
    """
    from trtqat.families.quant_format import (
        apply_spec_format,
        record_format,
    )
    from trtqat.quant.format_apply import check_format_layers

    cfg = config or CalibOptions()
    acc = accel or Accel(model_device(model))
    qmodel = quantized_copy(model, cfg.skip_layers)
    name = getattr(cfg, "format", "int8")
    apply_spec_format(qmodel, record_format({}, name, getattr(cfg, "block_size", None),
                                            getattr(cfg, "int4_embeddings", False)))
    check_format_layers(qmodel, name)
    with acc.autocast():
        collect_encoder_stats(qmodel, tokenizer, list(sentences)[:cfg.num_sentences],
                              cfg.batch_size or DEFAULT_BATCH_SIZE,
                              cfg.max_length or DEFAULT_MAX_LENGTH, cfg.progress)
    set_amax(qmodel, cfg.method or DEFAULT_METHOD, cfg.percentile)
    return qmodel


# --------------------------------------------------------------------------- QAT
@dataclass(frozen=True)
class EncoderQATConfig:
    """How :func:`qat_encoder` fine-tunes.

    Args:
        epochs: passes over the training sentences (``max_steps`` may stop earlier).
        max_steps: optional cap on optimizer steps.
        batch_size, max_length: tokenization of the training batches.
        lr: AdamW starting rate after warm-up; ``final_lr_ratio`` of it at the end (cosine).
        warmup_ratio: fraction of the steps with a linear warm-up.
        weight_decay: AdamW weight decay.
        loss: ``"cosine"`` (1 - cos of normalised embeddings) or ``"mse"`` (on the
            mean-pooled embeddings before normalisation).
        max_grad_norm: gradient clipping (None: off).
        learn_amax: also train the per-tensor activation ranges (LSQ-style
            straight-through gradient); on all-MiniLM-L6-v2 this is what lifts QAT clearly
            above PTQ. Weight ranges stay per-row max.
        amax_lr: starting rate of the learned ranges (same schedule, no weight decay): ranges
            are O(1..10), at the weights' rate they would barely move.
        seed: shuffling of the sentences.
    """

    epochs: int = 3
    max_steps: int | None = None
    batch_size: int = 32
    max_length: int = DEFAULT_MAX_LENGTH
    lr: float = 1e-4
    final_lr_ratio: float = 0.01
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    loss: str = "cosine"
    max_grad_norm: float | None = 1.0
    learn_amax: bool = True
    amax_lr: float = 1e-2
    seed: int = 0
    progress: bool = False

    @classmethod
    def of(cls, options: dict[str, Any], **more: Any) -> EncoderQATConfig:
        """The config of the resolved ``options`` (a run's recipe: the keys that are fields of
        this class; its ``loss`` names the recipe's kind, "distill", and is not taken)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"loss"}
        return cls(**{k: v for k, v in {**options, **more}.items() if k in names})

    def __post_init__(self) -> None:
        _positive(self, "epochs", "batch_size", "max_length", "lr", "amax_lr")
        if self.max_steps is not None:
            _positive(self, "max_steps")
        if self.loss not in LOSSES:
            raise EncoderConfigError(f"unknown loss {self.loss!r}: use one of {', '.join(LOSSES)}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise EncoderConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0.0 <= self.final_lr_ratio <= 1.0:
            raise EncoderConfigError(f"final_lr_ratio must be in [0, 1], got {self.final_lr_ratio}")
        if self.weight_decay < 0:
            raise EncoderConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")


def distillation_loss(student: nn.Module, teacher: nn.Module, batch: dict[str, torch.Tensor],
                      loss: str = "cosine") -> torch.Tensor:
    """Distance between the student's and the (frozen) teacher's embeddings of one batch."""
    with torch.no_grad():
        target = teacher.pooled(**batch)
    pred = student.pooled(**batch)
    if loss == "cosine":
        return (1.0 - F.cosine_similarity(pred, target, dim=-1)).mean()
    if loss == "mse":
        return F.mse_loss(pred, target)
    raise EncoderConfigError(f"unknown loss {loss!r}: use one of {', '.join(LOSSES)}")


def _epoch_batches(sentences: list[str], batch_size: int, rng: random.Random,
                   bucket: int = 16) -> list[list[str]]:
    """One epoch of full batches: shuffled, sentences of similar length batched together
    (within groups of ``bucket`` batches) to cut padding, batch order shuffled again."""
    order = sentences[:]
    rng.shuffle(order)
    out = []
    group = batch_size * bucket
    for g in range(0, len(order) - batch_size + 1, group):
        part = sorted(order[g:g + group], key=len)
        out += [part[i:i + batch_size] for i in range(0, len(part) - batch_size + 1, batch_size)]
    rng.shuffle(out)
    return out


def _check_calibrated(student: nn.Module) -> None:
    n = 0
    for name, q in quantizers(student):
        if not q.disabled:
            n += 1
            if q.amax is None:
                raise QuantizerStateError(
                    f"quantizer '{name}' has no amax: calibrate the student first "
                    "(trtqat calibrate, or calibrated_copy) and pass it to qat_encoder")
    if n == 0:
        raise QuantizerStateError("the student has no enabled quantizer: pass a calibrated "
                                  "quantized encoder (calibrated_copy), not an FP32 one")


def tie_qkv_input_ranges(model: nn.Module) -> int:
    """Make the query, key and value projections of each attention block learn one range.

    The three read the same tensor; TensorRT fuses them into one GEMM only when that tensor
    has one scale, so their learned input amax becomes one shared parameter (the largest of
    the three). Blocks where any of the three is skipped or not learning are left alone.
    Returns the number of blocks tied.
    """
    tied = 0
    for block in model.modules():
        qs = [getattr(getattr(block, n, None), "_input_quantizer", None)
              for n in ("query", "key", "value")]
        if any(q is None or q.disabled or not q.learn_amax for q in qs):
            continue
        with torch.no_grad():
            start = torch.stack([q._amax.detach() for q in qs]).amax(dim=0)
            qs[0]._amax.copy_(start)
        for q in qs[1:]:
            q._amax = qs[0]._amax
        tied += 1
    return tied


def qat_encoder(student: nn.Module, teacher: nn.Module, tokenizer, sentences: Sequence[str],
                config: EncoderQATConfig | None = None,
                callback: Callable[[int, float], None] | None = None,
                accel: Accel | None = None) -> dict[str, Any]:
    """QAT by self-distillation: train the calibrated ``student`` in place towards ``teacher``.

    Both are :class:`~trtqat.families.encoder.minilm.SentenceEncoder`; the teacher is frozen and
    runs in eval mode. The student runs without dropout (eval mode, gradients on), so the
    only difference between the two is quantization. Returns the training history:
    ``{"steps", "loss" (per step), "lr" (per step), "wall_time_s"}``. ``callback(step,
    loss)`` runs after every optimizer step (e.g. to evaluate or log). Batches go to the
    student's device; ``accel`` adds autocast, the fp16 gradient scaler and torch.compile
    (of the whole distillation loss: student and teacher forward).
    """
    cfg = config or EncoderQATConfig()
    acc = accel or Accel(model_device(student))
    sentences = list(sentences)
    if len(sentences) < cfg.batch_size:
        raise EncoderConfigError(f"QAT needs at least batch_size={cfg.batch_size} sentences, "
                                 f"got {len(sentences)}")
    _check_calibrated(student)
    if cfg.learn_amax:
        for _, q in quantizers(student):
            if not q.disabled and not q.learn_amax and (q.axis is None or is_block(q)):
                q.init_learn_amax()  # per-tensor activations; int4 weights' block amax
        tie_qkv_input_ranges(student)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student.eval()  # no dropout: the student differs from the teacher only by quantization
    per_epoch = len(_epoch_batches(sentences, cfg.batch_size, random.Random(0)))
    total = per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    named = [(n, p) for n, p in student.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    ranges = [p for n, p in named if n.endswith("._amax")]
    weights = [p for n, p in named if not n.endswith("._amax")]
    groups = [{"params": weights, "lr": cfg.lr, "weight_decay": cfg.weight_decay}]
    if ranges:  # ranges are O(1..10): at the weights' rate they would not move
        groups.append({"params": ranges, "lr": cfg.amax_lr, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_lambda(
        total, math.floor(cfg.warmup_ratio * total), cfg.final_lr_ratio))
    rng = random.Random(cfg.seed)
    loss_fn = acc.compiled(distillation_loss)
    clip = None if cfg.max_grad_norm is None else (params, cfg.max_grad_norm)
    history: dict[str, Any] = {"loss": [], "lr": []}
    t0 = time.perf_counter()
    bar = progress_of(total=total, desc="qat", enabled=cfg.progress, unit="steps")
    step = 0
    try:
        while step < total:
            for chunk in _epoch_batches(sentences, cfg.batch_size, rng):
                if step >= total:
                    break
                batch = {k: v.to(acc.device) for k, v in
                         tokenize(tokenizer, chunk, cfg.max_length).items()}
                with acc.autocast():
                    loss = loss_fn(student, teacher, batch, cfg.loss)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"QAT loss became {loss.item()} at step {step}: "
                                             "lower lr")
                history["lr"].append(opt.param_groups[0]["lr"])
                opt.zero_grad(set_to_none=True)
                acc.backward_step(loss, opt, clip)
                sched.step()
                history["loss"].append(loss.item())
                step += 1
                if callback is not None:
                    callback(step, history["loss"][-1])
                bar.update(1)
                bar.set_postfix(loss=f"{history['loss'][-1]:.5f}")
    finally:
        bar.close()
    history["steps"] = step
    history["wall_time_s"] = time.perf_counter() - t0
    log.info("QAT: %d steps in %.1f s, loss %.5f -> %.5f", step, history["wall_time_s"],
             history["loss"][0], history["loss"][-1])
    return history

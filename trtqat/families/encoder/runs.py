"""The encoder family's stages: ``trtqat calibrate``/``qat`` on sentence encoders.

:class:`trtqat.families.encoder.EncoderFamily` runs these for the library verbs
``trtqat.stages.calibrate`` and ``trtqat.stages.qat_finetune``, with the configs every family
shares (``CalibrateConfig``, ``QATConfig``).

* :func:`calibrate_encoder_run`: PTQ of ``--model minilm`` (or a Hugging Face folder, or an
  FP32 encoder checkpoint) on the corpus' training split; evaluates embedding fidelity on
  the fixed held-out split and writes the run folder (``args.yaml``, ``metrics.jsonl``,
  ``last.pt``/``best.pt``, stage "ptq"). It also writes the FP32 reference checkpoint
  (stage "fp32") into the sibling folder ``fp32/`` (``--fp32-out``), so that
  ``trtqat compare --run <parent>`` finds the fp32, fp16 and ptq variants.
* :func:`qat_encoder_run`: QAT by self-distillation from a PTQ (or QAT) encoder checkpoint;
  the teacher is the FP32 checkpoint the PTQ run wrote (or the PTQ weights in float, which
  are the FP32 ones). Writes stage "qat".

Both run on ``--device`` (CPU or CUDA GPU) and take the speed options of
:mod:`trtqat.runs.accel` (``--amp``, ``--compile``; calibration statistics are collected
eagerly, and the FP32 reference embeddings in float32). The corpus split (seed 0) is the same in every stage, so held-out
sentences are never trained or calibrated on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trtqat.families.encoder.checkpoint import (
    FAMILY,
    build_encoder_from_checkpoint,
    encoder_spec,
    is_encoder_checkpoint,
    save_encoder_checkpoint,
)
from trtqat.families.encoder.corpus import (
    BUILTIN,
    Corpus,
    CorpusError,
    load_corpus,
    text_file_sentences,
)
from trtqat.families.encoder.metrics import embedding_fidelity
from trtqat.families.encoder.minilm import DEFAULT_MAX_LENGTH, MINILM, embed, load_encoder
from trtqat.families.encoder.recipes import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_METHOD,
    EncoderQATConfig,
    calibrated_copy,
    qat_encoder,
)
from trtqat.families.quant_format import int4_tables, record_format
from trtqat.families.types import StageResult
from trtqat.runs import recipes as R
from trtqat.runs.accel import Accel
from trtqat.runs.checkpoint import CheckpointError, copy_checkpoint, load_checkpoint
from trtqat.runs.qat_recipe import FINAL_LR_FRACTION
from trtqat.runs.run_dir import RunDir, RunDirError, check_out_dir, refuse_foreign
from trtqat.runs.run_lock import RunGuard

if TYPE_CHECKING:
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.qat import QATConfig

log = logging.getLogger(__name__)

DEFAULT_QAT_EPOCHS = 3  # ~460 steps of 32 built-in sentences; 1 epoch stops short of 0.99 cosine
DEFAULT_QAT_LR = 1e-4
SPLIT_SEED = 0  # the train/held-out split is the same in every stage
EMBED_BATCH = 64
# Options of image classifiers that an encoder run does not take (refused or ignored).
UNSUPPORTED = ("resume", "stop_after", "distill")
IGNORED = ("momentum", "opt", "label_smoothing", "image_size", "limit_batches")


def _accel(cfg: Any) -> Accel:
    """The run's device (``cfg.device``; refuses CUDA without a GPU) and speed options."""
    from trtqat.runs.distributed import pick_device

    return Accel.setup(cfg, pick_device(cfg.device), images=False)


def _check_data(data: str | None) -> str:
    """``builtin`` or an existing, non-empty text file (one sentence a line)."""
    if data is None or str(data) == BUILTIN:
        return BUILTIN
    if not text_file_sentences(data):  # raises for a missing file
        raise CorpusError(f"--data {data} holds no sentences: pass a UTF-8 text file with one "
                          f"sentence per line, or '{BUILTIN}'")
    return str(data)


def corpus_of(data: str | None) -> tuple[str, Corpus]:
    """``(data, corpus)``: ``--data`` checked (``builtin`` or a text file) and its sentences,
    split into training and held-out ones the same way in every stage."""
    data = _check_data(data)
    return data, load_corpus(data, seed=SPLIT_SEED)


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def fidelity(model: nn.Module, tokenizer, sentences, ref: torch.Tensor,
             max_length: int, accel: Accel | None = None) -> dict[str, Any]:
    """Embedding fidelity of ``model`` on ``sentences`` against the FP32 embeddings ``ref``
    (``model`` runs on ``accel``'s device, autocast and compile setting)."""
    acc = accel or Accel()
    with acc.autocast():
        test = embed(acc.compiled(model), tokenizer, list(sentences), EMBED_BATCH, max_length,
                     device=acc.device)
    return {k: _clean(v) for k, v in embedding_fidelity(ref, test).items()}


def calibrate_recipe(cfg: CalibrateConfig) -> dict[str, Any]:
    """The encoder's calibration defaults for the options ``cfg`` leaves None."""
    return {"method": cfg.method or DEFAULT_METHOD,
            "batch_size": cfg.batch_size or DEFAULT_BATCH_SIZE,
            "max_length": cfg.max_length or DEFAULT_MAX_LENGTH}


def qat_recipe(cfg: QATConfig, src: dict[str, Any]) -> dict[str, Any]:
    """The encoder's QAT: self-distillation ("distill") from the FP32 teacher, AdamW, 3
    epochs at 1e-4 cosine-annealed to 1% of it, the calibration's tokens per sentence."""
    lr = cfg.lr or DEFAULT_QAT_LR
    min_lr = FINAL_LR_FRACTION * lr if cfg.min_lr is None else cfg.min_lr
    if min_lr >= lr:
        raise R.ConfigError(f"--min-lr ({min_lr}) must be below the QAT lr ({lr})")
    return {"epochs": cfg.epochs or DEFAULT_QAT_EPOCHS, "max_steps": cfg.max_steps,
            "lr": lr, "min_lr": min_lr, "final_lr_ratio": min_lr / lr,
            "weight_decay": cfg.weight_decay or 0.0,
            "batch_size": cfg.batch_size or DEFAULT_BATCH_SIZE,
            "max_length": cfg.max_length or int(src["model"].get("max_length",
                                                                  DEFAULT_MAX_LENGTH)),
            "loss": "distill"}


def _source(cfg: CalibrateConfig, ckpt: dict[str, Any] | None
            ) -> tuple[nn.Module, Any, str, str]:
    """``(FP32 encoder, tokenizer, arch, source description)``."""
    if ckpt is not None:
        if ckpt.get("stage") != "fp32":
            raise CheckpointError(f"{cfg.checkpoint} holds a {ckpt.get('stage')!r} checkpoint: "
                                  "calibrate needs an FP32 one (or --model minilm)")
        arch = ckpt["model"]["arch"]
        if cfg.model and cfg.model != arch:
            raise CheckpointError(f"{cfg.checkpoint} holds {arch}, not {cfg.model}: drop --model")
        model, tok = build_encoder_from_checkpoint(ckpt, quantized=False)
        return model, tok, arch, str(Path(cfg.checkpoint).resolve())
    model, tok = load_encoder(cfg.model)
    arch = cfg.model if cfg.model == MINILM else str(Path(cfg.model).expanduser().resolve())
    return model, tok, arch, f"pretrained:{arch}"


def _fp32_folder(cfg: CalibrateConfig, out: Path, source: str) -> tuple[Path, bool]:
    """Where the FP32 reference checkpoint goes, and whether it must be (re)written."""
    folder = Path(cfg.fp32_out) if cfg.fp32_out else out.parent / "fp32"
    if folder.resolve() == out.resolve():
        raise R.ConfigError(f"--fp32-out {folder} is the --out folder: choose another")
    best = folder / "best.pt"
    if cfg.checkpoint and Path(cfg.checkpoint).resolve() in (best.resolve(), folder.resolve()):
        return folder, False  # calibrating the reference in place
    refuse_foreign(folder, "--fp32-out")  # the user's files there are never replaced
    if not best.exists():
        check_out_dir(folder, resume=False, overwrite=cfg.overwrite)
        return folder, True
    ckpt = load_checkpoint(best)
    if is_encoder_checkpoint(ckpt) and ckpt.get("stage") == "fp32" and ckpt.get(
            "source") == source:
        return folder, False  # the same reference, written by an earlier calibrate
    if cfg.overwrite:
        return folder, True
    raise RunDirError(f"{folder} already holds another run: pass --overwrite to replace it, or "
                      "--fp32-out for the FP32 reference checkpoint")


def _write_run(out: Path, args: dict, records: list[dict], model: nn.Module, *, stage: str,
               spec: dict, **extra: Any) -> Path:
    """args.yaml, metrics.jsonl, last.pt and best.pt (the same file) in ``out``."""
    run = RunDir(out, tensorboard=False)
    try:  # all of the run or none of it (a full disk leaves no run without checkpoint)
        run.start(args, resume=False)
        save_encoder_checkpoint(run.file("last.pt"), model, stage=stage, spec=spec,
                                metrics=records[-1], args=args, **extra)
        copy_checkpoint(run.file("last.pt"), run.file("best.pt"))
        for rec in records:
            run.log_metrics(rec)
    except BaseException:
        run.discard()
        raise
    run.close()
    return run.file("best.pt")


def calibrate_encoder_run(cfg: CalibrateConfig, family: Any, src: dict[str, Any] | None
                          ) -> StageResult:
    """PTQ of an encoder (``src``: a loaded FP32 encoder checkpoint, or None for
    ``cfg.model``); writes the "ptq" run in ``cfg.out`` and the "fp32" one beside it.

    The result's ``best`` is the held-out mean cosine against FP32; ``details`` holds the
    held-out ``fidelity`` and the ``fp32`` reference folder.
    """
    acc = _accel(cfg)  # bad options refused before the folder is touched
    with RunGuard(cfg.out, resume=False, overwrite=cfg.overwrite,
                  inputs=[("--checkpoint", cfg.checkpoint)]) as guard:
        return _calibrate_encoder_run(cfg, family, src, guard.path, acc)


def _calibrate_encoder_run(cfg: CalibrateConfig, family: Any, src: dict[str, Any] | None,
                           out: Path, acc: Accel) -> StageResult:
    batches = family.data(cfg, "calib", data=cfg.data)
    corpus, data = batches.info["corpus"], batches.info["data"]
    fp32, tok, arch, source = _source(cfg, src)
    fp32.to(acc.device)
    fp32_dir, write_fp32 = _fp32_folder(cfg, out, source)
    torch.manual_seed(cfg.seed)
    r = family.recipe("calibrate", cfg, src)
    cfg = dataclasses.replace(cfg, **r)  # calibrated_copy reads the resolved options
    t0 = time.perf_counter()
    qmodel = calibrated_copy(fp32, tok, corpus.train, cfg, accel=acc)
    calib_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    ref = embed(fp32, tok, list(corpus.heldout), EMBED_BATCH, cfg.max_length, acc.device)
    fid = fidelity(qmodel, tok, corpus.heldout, ref, cfg.max_length, acc)
    eval_s = time.perf_counter() - t1
    used = min(cfg.num_sentences, len(corpus.train))
    record = {"stage": "ptq", "epoch": 0, "method": cfg.method, **fid,
              "calib_sentences": used, "calib_time_s": calib_s, "eval_time_s": eval_s,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    args = R.as_args(cfg, model=arch, data=data, fp32_out=str(fp32_dir), family=FAMILY)
    corpus_info = {"source": corpus.source, "split_seed": SPLIT_SEED, **corpus.info}
    fp32_spec = encoder_spec(arch, quantized=False, max_length=cfg.max_length,
                             normalize=fp32.normalize)
    if write_fp32:  # everything is computed: only now do run folders appear
        fp32_args = {"model": arch, "data": data, "max_length": cfg.max_length,
                     "family": FAMILY, "source": source}
        fp32_rec = {"stage": "fp32", "epoch": 0, "mean_cosine": 1.0, "spearman": 1.0,
                    "sentences": len(corpus.heldout), "note": "FP32 reference of " + str(out)}
        _write_run(fp32_dir, fp32_args, [fp32_rec], fp32, stage="fp32", spec=fp32_spec,
                   source=source, corpus=corpus_info)
    spec = encoder_spec(arch, quantized=True, max_length=cfg.max_length,
                        skip_layers=cfg.skip_layers, normalize=fp32.normalize)
    record_format(spec, cfg.format, cfg.block_size, int4_tables(cfg))
    calib = {"method": cfg.method, "percentile": cfg.percentile,
             "num_sentences": cfg.num_sentences, "sentences_seen": used, "source": source}
    _write_run(out, args, [record], qmodel, stage="ptq", spec=spec, calib=calib,
               corpus=corpus_info, fp32_checkpoint=str((fp32_dir / "best.pt").resolve()))
    log.info("ptq (%s): held-out mean cosine %.5f, Spearman %s", cfg.method,
             fid["mean_cosine"], fid["spearman"])
    return StageResult("calibrate", str(out), record, best=fid["mean_cosine"],
                       metric="mean_cosine", details={"fidelity": fid, "fp32": str(fp32_dir)})


def _teacher(src: dict[str, Any]) -> tuple[nn.Module, str]:
    """The FP32 teacher of a PTQ/QAT checkpoint, and where it came from."""
    path = src.get("fp32_checkpoint")
    if path and Path(path).is_file():
        ref = load_checkpoint(path)
        if is_encoder_checkpoint(ref) and ref.get("stage") == "fp32":
            return build_encoder_from_checkpoint(ref, quantized=False)[0], str(path)
    if src.get("stage") == "ptq":  # PTQ leaves the weights alone: in float they are FP32
        return build_encoder_from_checkpoint(src, quantized=False)[0], "ptq weights in float"
    arch = src["model"]["arch"]
    log.warning("the FP32 checkpoint of this run is gone: the teacher is %s's pretrained "
                "weights", arch)
    return load_encoder(arch)[0], f"pretrained:{arch}"


def _check_qat_options(cfg: QATConfig) -> None:
    """Refuse the image-classifier options an encoder QAT cannot honour; warn about those
    it ignores."""
    for name in UNSUPPORTED:
        if getattr(cfg, name, None):
            raise R.ConfigError(f"{R.flag(name)} is not supported for encoder checkpoints: "
                                "start again with --overwrite")
    ignored = [R.flag(k) for k in IGNORED if getattr(cfg, k, None) is not None]
    if ignored:
        log.warning("%s: options of image classifiers, ignored for an encoder (AdamW)",
                    ", ".join(ignored))


def qat_encoder_run(cfg: QATConfig, family: Any, src: dict[str, Any]) -> StageResult:
    """QAT of a calibrated encoder checkpoint ``src``; writes the "qat" run in ``cfg.out``.

    The result's ``best`` and ``before`` are the held-out mean cosine after and before;
    ``details`` holds both fidelities (``fidelity``, ``start``).
    """
    _check_qat_options(cfg)
    acc = _accel(cfg)  # bad options refused before the folder is touched
    with RunGuard(cfg.out, resume=False, overwrite=cfg.overwrite,
                  inputs=[("--checkpoint", cfg.checkpoint)]) as guard:
        return _qat_encoder_run(cfg, family, src, guard.path, acc)


def _qat_encoder_run(cfg: QATConfig, family: Any, src: dict[str, Any], out: Path,
                     acc: Accel) -> StageResult:
    if src.get("stage") not in ("ptq", "qat"):
        raise CheckpointError(f"{cfg.checkpoint} holds a {src.get('stage')!r} checkpoint: "
                              f"calibrate it first: trtqat calibrate --checkpoint {cfg.checkpoint}")
    batches = family.data(cfg, "train", data=cfg.data or (src.get("args") or {}).get("data"))
    corpus, data = batches.info["corpus"], batches.info["data"]
    spec = dict(src["model"])
    r = family.recipe("qat", cfg, src)
    qcfg = EncoderQATConfig.of(r, seed=cfg.seed, progress=cfg.progress)
    student, tok = build_encoder_from_checkpoint(src)
    if cfg.skip_layers:  # kept in float from now on, recorded with the calibrate-time ones
        from trtqat.quant.model_ops import disable_layers, quantizers

        modules = dict(student.named_modules())
        for name in disable_layers(student, cfg.skip_layers):
            for _, q in quantizers(modules[name]):
                q._amax = None  # a rebuild with these skip_layers holds no range for them
        spec["skip_layers"] = list(dict.fromkeys([*(spec.get("skip_layers") or []),
                                                  *cfg.skip_layers]))
    teacher, teacher_src = _teacher(src)
    student.to(acc.device)
    teacher.to(acc.device)
    torch.manual_seed(cfg.seed)
    ref = embed(teacher, tok, list(corpus.heldout), EMBED_BATCH, qcfg.max_length, acc.device)
    start = fidelity(student, tok, corpus.heldout, ref, qcfg.max_length, acc)
    records = [{"stage": "qat", "epoch": 0, "step": 0, **start,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S")}]
    every = 10

    def on_step(step: int, loss: float) -> None:
        if step % every == 0:
            records.append({"stage": "qat", "epoch": 0, "step": step, "loss": loss})

    hist = qat_encoder(student, teacher, tok, corpus.train, qcfg, callback=on_step, accel=acc)
    t1 = time.perf_counter()
    fid = fidelity(student, tok, corpus.heldout, ref, qcfg.max_length, acc)
    record = {"stage": "qat", "epoch": qcfg.epochs, "step": hist["steps"], **fid,
              "start_mean_cosine": start["mean_cosine"], "loss_first": hist["loss"][0],
              "loss_last": hist["loss"][-1], "train_time_s": hist["wall_time_s"],
              "eval_time_s": time.perf_counter() - t1,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    records.append(record)
    args = R.as_args(cfg, model=spec["arch"], data=data, epochs=qcfg.epochs,
                     lr=r["lr"], min_lr=r["min_lr"], weight_decay=qcfg.weight_decay,
                     batch_size=qcfg.batch_size, max_length=qcfg.max_length, family=FAMILY,
                     teacher=teacher_src, steps=hist["steps"])
    spec["quantized"] = True
    _write_run(out, args, records, student, stage="qat", spec=spec, calib=src.get("calib"),
               corpus=src.get("corpus"), fp32_checkpoint=src.get("fp32_checkpoint"))
    log.info("qat: %d steps, held-out mean cosine %.5f -> %.5f", hist["steps"],
             start["mean_cosine"], fid["mean_cosine"])
    return StageResult("qat", str(out), record, best=fid["mean_cosine"],
                       before=start["mean_cosine"], metric="mean_cosine",
                       details={"start": start, "fidelity": fid})


def describe(stage: str, result: StageResult) -> str:
    """The closing line of the CLI: held-out fidelity and the run folder."""
    fid = result.details["fidelity"]
    sp = fid.get("spearman")
    text = (f"{stage}: held-out mean cosine vs FP32 {fid['mean_cosine']:.5f}, Spearman "
            f"{'-' if sp is None else format(sp, '.5f')} ({fid['sentences']} sentences)")
    if result.before is not None:
        text += f", from {result.before:.5f}"
    return f"{text}; run folder {result.out}"

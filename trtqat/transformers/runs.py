"""Run folders of the encoder verbs: ``trtqat calibrate``/``qat`` on sentence encoders.

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
:mod:`trtqat.train.accel` (``--amp``, ``--compile``; calibration statistics are collected
eagerly, and the FP32 reference embeddings in float32). The corpus split (seed 0) is the same in every stage, so held-out
sentences are never trained or calibrated on.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtqat.quant.model_ops import AMAX_METHODS
from trtqat.train import recipes as R
from trtqat.train.accel import Accel, AccelOptions, check_options
from trtqat.train.checkpoint import CheckpointError, copy_checkpoint, load_checkpoint
from trtqat.train.run_dir import RunDir, RunDirError, check_out_dir
from trtqat.train.run_lock import RunGuard
from trtqat.transformers.checkpoint import (
    build_encoder_from_checkpoint,
    encoder_spec,
    is_encoder_checkpoint,
    save_encoder_checkpoint,
)
from trtqat.transformers.corpus import BUILTIN, CorpusError, load_corpus, text_file_sentences
from trtqat.transformers.metrics import embedding_fidelity
from trtqat.transformers.minilm import DEFAULT_MAX_LENGTH, MINILM, embed, load_encoder
from trtqat.transformers.recipes import (
    EncoderCalibConfig,
    EncoderQATConfig,
    calibrate_encoder,
    qat_encoder,
)

log = logging.getLogger(__name__)

DEFAULT_METHOD = "mse"  # the best PTQ calibrator on all-MiniLM-L6-v2
DEFAULT_QAT_EPOCHS = 3  # ~460 steps of 32 built-in sentences; 1 epoch stops short of 0.99 cosine
DEFAULT_QAT_LR = 1e-4
SPLIT_SEED = 0  # the train/held-out split is the same in every stage
EMBED_BATCH = 64


def is_encoder_name(model: str | None) -> bool:
    """True when ``--model`` names an encoder: ``minilm`` or a path (a folder)."""
    if not model:
        return False
    return model == MINILM or "/" in model or Path(model).expanduser().is_dir()


def _accel(cfg: AccelOptions) -> Accel:
    """The run's device (``cfg.device``; refuses CUDA without a GPU) and speed options."""
    from trtqat.train.distributed import pick_device

    return Accel.setup(cfg, pick_device(cfg.device), images=False)


def _check_data(data: str | None) -> str:
    """``builtin`` or an existing, non-empty text file (one sentence a line)."""
    if data is None or str(data) == BUILTIN:
        return BUILTIN
    if not text_file_sentences(data):  # raises for a missing file
        raise CorpusError(f"--data {data} holds no sentences: pass a UTF-8 text file with one "
                          f"sentence per line, or '{BUILTIN}'")
    return str(data)


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


@dataclass
class EncoderCalibrateConfig(AccelOptions):
    """Options of ``trtqat calibrate`` for an encoder (``--model`` or an FP32 checkpoint)."""

    model: str | None = None
    checkpoint: str | None = None
    out: str = "runs/ptq"
    fp32_out: str | None = None
    data: str | None = None
    method: str = DEFAULT_METHOD
    percentile: float = 99.99
    num_sentences: int = 512
    max_length: int = DEFAULT_MAX_LENGTH
    batch_size: int | None = None
    skip_layers: tuple[str, ...] = ()
    seed: int = 0
    overwrite: bool = False
    device: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.model and not self.checkpoint:
            raise R.ConfigError("give --model minilm (or a Hugging Face model folder) or "
                                "--checkpoint of an FP32 encoder")
        if self.method not in AMAX_METHODS:
            raise R.ConfigError(f"unknown --method {self.method!r}: use one of "
                                f"{', '.join(AMAX_METHODS)}")
        R.check_positive(self, "num_sentences", "max_length")
        R.check_positive(self, "batch_size", allow_none=True)
        if not str(self.out):
            raise R.ConfigError("--out must name a run folder")
        check_options(self)
        self.skip_layers = tuple(self.skip_layers)


def _source(cfg: EncoderCalibrateConfig) -> tuple[nn.Module, Any, str, str]:
    """``(FP32 encoder, tokenizer, arch, source description)``."""
    if cfg.checkpoint:
        ckpt = load_checkpoint(cfg.checkpoint)
        if not is_encoder_checkpoint(ckpt):
            raise CheckpointError(f"{cfg.checkpoint} is not an encoder checkpoint")
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


def _fp32_folder(cfg: EncoderCalibrateConfig, out: Path, source: str) -> tuple[Path, bool]:
    """Where the FP32 reference checkpoint goes, and whether it must be (re)written."""
    folder = Path(cfg.fp32_out) if cfg.fp32_out else out.parent / "fp32"
    if folder.resolve() == out.resolve():
        raise R.ConfigError(f"--fp32-out {folder} is the --out folder: choose another")
    best = folder / "best.pt"
    if cfg.checkpoint and Path(cfg.checkpoint).resolve() in (best.resolve(), folder.resolve()):
        return folder, False  # calibrating the reference in place
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
    run.start(args, resume=False)
    for rec in records:
        run.log_metrics(rec)
    save_encoder_checkpoint(run.file("last.pt"), model, stage=stage, spec=spec,
                            metrics=records[-1], args=args, **extra)
    copy_checkpoint(run.file("last.pt"), run.file("best.pt"))
    run.close()
    return run.file("best.pt")


def calibrate_encoder_run(cfg: EncoderCalibrateConfig) -> dict[str, Any]:
    """PTQ of an encoder; writes the "ptq" run in ``cfg.out`` and the "fp32" one beside it.

    Returns ``{"last": metrics record, "fidelity": held-out fidelity, "out", "fp32"}``.
    """
    acc = _accel(cfg)  # bad options refused before the folder is touched
    with RunGuard(cfg.out, resume=False, overwrite=cfg.overwrite,
                  inputs=[("--checkpoint", cfg.checkpoint)]) as guard:
        return _calibrate_encoder_run(cfg, guard.path, acc)


def _calibrate_encoder_run(cfg: EncoderCalibrateConfig, out: Path, acc: Accel) -> dict[str, Any]:
    data = _check_data(cfg.data)
    fp32, tok, arch, source = _source(cfg)
    fp32.to(acc.device)
    fp32_dir, write_fp32 = _fp32_folder(cfg, out, source)
    corpus = load_corpus(data, seed=SPLIT_SEED)
    torch.manual_seed(cfg.seed)
    batch = cfg.batch_size or 32
    t0 = time.perf_counter()
    calib_cfg = EncoderCalibConfig(
        method=cfg.method, percentile=cfg.percentile, num_sentences=cfg.num_sentences,
        batch_size=batch, max_length=cfg.max_length, skip_layers=cfg.skip_layers,
        progress=cfg.progress)
    qmodel = calibrate_encoder(fp32, tok, corpus.train, calib_cfg, accel=acc)
    calib_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    ref = embed(fp32, tok, list(corpus.heldout), EMBED_BATCH, cfg.max_length, acc.device)
    fid = fidelity(qmodel, tok, corpus.heldout, ref, cfg.max_length, acc)
    eval_s = time.perf_counter() - t1
    used = min(cfg.num_sentences, len(corpus.train))
    record = {"stage": "ptq", "epoch": 0, "method": cfg.method, **fid,
              "calib_sentences": used, "calib_time_s": calib_s, "eval_time_s": eval_s,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    args = R.as_args(cfg, model=arch, data=data, batch_size=batch,
                     fp32_out=str(fp32_dir), family="transformer")
    corpus_info = {"source": corpus.source, "split_seed": SPLIT_SEED, **corpus.info}
    fp32_spec = encoder_spec(arch, quantized=False, max_length=cfg.max_length,
                             normalize=fp32.normalize)
    if write_fp32:  # everything is computed: only now do run folders appear
        fp32_args = {"model": arch, "data": data, "max_length": cfg.max_length,
                     "family": "transformer", "source": source}
        fp32_rec = {"stage": "fp32", "epoch": 0, "mean_cosine": 1.0, "spearman": 1.0,
                    "sentences": len(corpus.heldout), "note": "FP32 reference of " + str(out)}
        _write_run(fp32_dir, fp32_args, [fp32_rec], fp32, stage="fp32", spec=fp32_spec,
                   source=source, corpus=corpus_info)
    spec = encoder_spec(arch, quantized=True, max_length=cfg.max_length,
                        skip_layers=cfg.skip_layers, normalize=fp32.normalize)
    calib = {"method": cfg.method, "percentile": cfg.percentile,
             "num_sentences": cfg.num_sentences, "sentences_seen": used, "source": source}
    _write_run(out, args, [record], qmodel, stage="ptq", spec=spec, calib=calib,
               corpus=corpus_info, fp32_checkpoint=str((fp32_dir / "best.pt").resolve()))
    log.info("ptq (%s): held-out mean cosine %.5f, Spearman %s", cfg.method,
             fid["mean_cosine"], fid["spearman"])
    return {"last": record, "fidelity": fid, "out": str(out), "fp32": str(fp32_dir)}


@dataclass
class EncoderQATRunConfig(AccelOptions):
    """Options of ``trtqat qat`` for an encoder checkpoint; None: the default (see module)."""

    checkpoint: str = ""
    out: str = "runs/qat"
    data: str | None = None
    epochs: int | None = None
    max_steps: int | None = None
    lr: float | None = None
    min_lr: float | None = None
    weight_decay: float | None = None
    batch_size: int | None = None
    max_length: int | None = None
    skip_layers: tuple[str, ...] = ()
    seed: int = 0
    overwrite: bool = False
    device: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        self.skip_layers = tuple(self.skip_layers)
        if not str(self.checkpoint):
            raise R.ConfigError("--checkpoint is required: the best.pt of a `trtqat calibrate` run")
        R.check_positive(self, "epochs", "max_steps", "lr", "batch_size", "max_length",
                         allow_none=True)
        R.check_positive(self, "min_lr", "weight_decay", allow_none=True, zero=True)
        if self.lr is not None and self.min_lr is not None and self.min_lr >= self.lr:
            raise R.ConfigError(f"--min-lr ({self.min_lr}) must be below --lr ({self.lr})")
        if not str(self.out):
            raise R.ConfigError("--out must name a run folder")
        check_options(self)


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


def qat_encoder_run(cfg: EncoderQATRunConfig) -> dict[str, Any]:
    """QAT of a calibrated encoder checkpoint; writes the "qat" run in ``cfg.out``.

    Returns ``{"last", "start" (fidelity before), "fidelity" (after), "out"}``.
    """
    acc = _accel(cfg)  # bad options refused before the folder is touched
    with RunGuard(cfg.out, resume=False, overwrite=cfg.overwrite,
                  inputs=[("--checkpoint", cfg.checkpoint)]) as guard:
        return _qat_encoder_run(cfg, guard.path, acc)


def _qat_encoder_run(cfg: EncoderQATRunConfig, out: Path, acc: Accel) -> dict[str, Any]:
    src = load_checkpoint(cfg.checkpoint)
    if not is_encoder_checkpoint(src):
        raise CheckpointError(f"{cfg.checkpoint} is not an encoder checkpoint")
    if src.get("stage") not in ("ptq", "qat"):
        raise CheckpointError(f"{cfg.checkpoint} holds a {src.get('stage')!r} checkpoint: "
                              f"calibrate it first: trtqat calibrate --checkpoint {cfg.checkpoint}")
    src_args = src.get("args") or {}
    data = _check_data(cfg.data or src_args.get("data"))
    spec = dict(src["model"])
    max_length = cfg.max_length or int(spec.get("max_length", DEFAULT_MAX_LENGTH))
    lr = cfg.lr or DEFAULT_QAT_LR
    min_lr = 0.01 * lr if cfg.min_lr is None else cfg.min_lr
    if min_lr >= lr:
        raise R.ConfigError(f"--min-lr ({min_lr}) must be below the QAT lr ({lr})")
    qcfg = EncoderQATConfig(
        epochs=cfg.epochs or DEFAULT_QAT_EPOCHS, max_steps=cfg.max_steps,
        batch_size=cfg.batch_size or 32, max_length=max_length, lr=lr,
        final_lr_ratio=min_lr / lr, weight_decay=cfg.weight_decay or 0.0, seed=cfg.seed,
        progress=cfg.progress)
    corpus = load_corpus(data, seed=SPLIT_SEED)
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
    ref = embed(teacher, tok, list(corpus.heldout), EMBED_BATCH, max_length, acc.device)
    start = fidelity(student, tok, corpus.heldout, ref, max_length, acc)
    records = [{"stage": "qat", "epoch": 0, "step": 0, **start,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S")}]
    every = 10

    def on_step(step: int, loss: float) -> None:
        if step % every == 0:
            records.append({"stage": "qat", "epoch": 0, "step": step, "loss": loss})

    hist = qat_encoder(student, teacher, tok, corpus.train, qcfg, callback=on_step, accel=acc)
    t1 = time.perf_counter()
    fid = fidelity(student, tok, corpus.heldout, ref, max_length, acc)
    record = {"stage": "qat", "epoch": qcfg.epochs, "step": hist["steps"], **fid,
              "start_mean_cosine": start["mean_cosine"], "loss_first": hist["loss"][0],
              "loss_last": hist["loss"][-1], "train_time_s": hist["wall_time_s"],
              "eval_time_s": time.perf_counter() - t1,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    records.append(record)
    args = R.as_args(cfg, model=spec["arch"], data=data, epochs=qcfg.epochs, lr=lr,
                     min_lr=min_lr, weight_decay=qcfg.weight_decay,
                     batch_size=qcfg.batch_size, max_length=max_length, family="transformer",
                     teacher=teacher_src, steps=hist["steps"])
    spec["quantized"] = True
    _write_run(out, args, records, student, stage="qat", spec=spec, calib=src.get("calib"),
               corpus=src.get("corpus"), fp32_checkpoint=src.get("fp32_checkpoint"))
    log.info("qat: %d steps, held-out mean cosine %.5f -> %.5f", hist["steps"],
             start["mean_cosine"], fid["mean_cosine"])
    return {"last": record, "start": start, "fidelity": fid, "out": str(out)}


def describe(stage: str, result: dict[str, Any]) -> str:
    """The closing line of the CLI: held-out fidelity and the run folder."""
    fid = result["fidelity"]
    sp = fid.get("spearman")
    text = (f"{stage}: held-out mean cosine vs FP32 {fid['mean_cosine']:.5f}, Spearman "
            f"{'-' if sp is None else format(sp, '.5f')} ({fid['sentences']} sentences)")
    if "start" in result:
        text += f", from {result['start']['mean_cosine']:.5f}"
    return f"{text}; run folder {result['out']}"

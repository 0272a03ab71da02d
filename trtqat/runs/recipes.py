"""What the training stages share (``trtqat.stages``: train, calibrate, qat): the option
bases, config checks, optimizer and cosine schedule, the checkpoint payload, the resume checks
and the stage context (:func:`stage`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtqat.finite import check_finite_arrays
from trtqat.runopts import MAX_LR, OPTIMIZERS, ConfigError, check_positive, flag
from trtqat.runs import accel
from trtqat.runs import distributed as D
from trtqat.runs.checkpoint import CheckpointError, load_checkpoint
from trtqat.runs.loop import cosine_lambda
from trtqat.runs.run_dir import RunDir
from trtqat.runs.run_lock import RunGuard

log = logging.getLogger(__name__)

# Options that may change between a run and its --resume without changing the result.
RESUME_FREE = {"resume", "overwrite", "workers", "progress", "stop_after", "device", "out",
               "strict", "world_size", "compile", "channels_last", "threads",
               "cuda_graphs"}


@dataclasses.dataclass
class ImageOptions:
    """Model and data options of the stage configs (None: the family's default, or what the
    previous stage recorded). Encoders read ``model``, ``data`` and ``batch_size``."""

    model: str | None = None
    data: str | None = None
    image_size: int | tuple[int, int] | None = None
    resize: int | tuple[int, int] | str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channels: int | None = None
    batch_size: int | None = None


@dataclasses.dataclass
class ScheduleOptions:
    """Optimizer and schedule options of the training recipes (None: the stage's default)."""

    epochs: int | None = None
    lr: float | None = None
    min_lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    opt: str | None = None
    label_smoothing: float | None = None
    resume: bool = False
    stop_after: int | None = None


def fill_defaults(cfg: Any, defaults: dict[str, Any]) -> None:
    """Set every field of ``cfg`` that is None to its entry in ``defaults``."""
    for name, value in defaults.items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)


def check_data(cfg: Any) -> None:
    """``--image-size`` parsed (N or HxW, each > 0; a batch of it fits in memory), and no
    preprocessing option that ``--data`` would ignore: the data check of the image configs."""
    if getattr(cfg, "image_size", None) is not None:
        from trtqat.sizes import check_image_memory, parse_size

        cfg.image_size = parse_size(cfg.image_size)
        check_image_memory(cfg.image_size, getattr(cfg, "channels", None) or 3,
                           getattr(cfg, "batch_size", None) or 1, "one batch")
    check_preprocess_applies(cfg, getattr(cfg, "data", None))


def check_preprocess_applies(cfg: Any, data: str | None) -> None:
    """Refuse ``--mean``/``--std``/``--resize`` where ``data`` ignores them: digits and
    synthetic images come normalised their own way, arrays are already preprocessed."""
    given = [flag(n) for n in ("mean", "std", "resize") if getattr(cfg, n, None) is not None]
    if not given or data is None:
        return
    from trtqat.arrays import is_array_spec

    kind = str(data) if data in ("digits", "synthetic") else (
        "array" if is_array_spec(str(data)) else "folder")
    why = {"digits": "digits images are normalised with their own statistics",
           "synthetic": "synthetic images are made normalised",
           "array": "an array file holds images already preprocessed"}.get(kind)
    if why:
        raise ConfigError(f"{'/'.join(given)} would be ignored with --data {data}: {why}; "
                          "drop it (it applies to image folders)")


def check_array_size(cfg: Any, data: str | None, size: tuple[int, int]) -> None:
    """Refuse an ``--image-size`` other than the ``size`` of the arrays ``data`` holds: an
    array file's images are used as they are (never resized or cropped)."""
    given = getattr(cfg, "image_size", None)
    if given is None or data is None:
        return
    from trtqat.arrays import is_array_spec
    from trtqat.sizes import hw, size_text

    if is_array_spec(str(data)) and hw(given) != tuple(size):
        raise ConfigError(f"--image-size {size_text(given)} does not match --data {data}: its "
                          f"images are {size_text(size)} and arrays are used as they are; "
                          f"drop --image-size (or pass {size_text(size)})")


def check_schedule(cfg: Any) -> None:
    """The optimizer options a config gives (None: derived later): ranges and --opt."""
    check_positive(cfg, "epochs", "lr", allow_none=True)
    check_positive(cfg, "min_lr", "momentum", "weight_decay", "warmup_epochs", allow_none=True,
                   zero=True)
    opt = getattr(cfg, "opt", None)
    if opt is not None and opt not in OPTIMIZERS:
        raise ConfigError(f"unknown --opt {opt!r}: use one of {', '.join(OPTIMIZERS)}")
    smoothing = getattr(cfg, "label_smoothing", None)
    if smoothing is not None and not 0.0 <= smoothing < 1.0:
        raise ConfigError(f"--label-smoothing must be in [0, 1), got {smoothing}")
    lr, min_lr = getattr(cfg, "lr", None), getattr(cfg, "min_lr", None)
    if lr is not None and lr > MAX_LR:
        raise ConfigError(f"--lr must be <= {MAX_LR:g} (a learning rate that large diverges), "
                          f"got {lr:g}; use e.g. 0.01")
    if lr is not None and min_lr is not None and min_lr >= lr:
        raise ConfigError(f"--min-lr ({min_lr}) must be below --lr ({lr})")


def as_args(cfg: Any, **resolved: Any) -> dict[str, Any]:
    """The config as plain YAML-able types, with resolved values filled in."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = resolved.get(f.name, getattr(cfg, f.name))
        out[f.name] = list(value) if isinstance(value, tuple) else (
            str(value) if isinstance(value, Path) else value)
    for k, v in resolved.items():
        out.setdefault(k, v)
    return out


def build_optimizer(name: str, model: nn.Module, lr: float, momentum: float,
                    weight_decay: float, *, graphs: bool = False) -> torch.optim.Optimizer:
    """SGD with momentum (the torchvision reference default) or AdamW.

    ``graphs`` (``--cuda-graphs``): the fused implementation, with the learning rate a
    tensor on the parameters' device, so that a captured step reads the scheduler's rate."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused: dict[str, Any] = {}
    if graphs and params:
        fused = {"fused": True}
        lr = torch.tensor(float(lr), dtype=torch.float32, device=params[0].device)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=momentum > 0, **fused)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **fused,
                                 **({"capturable": True} if fused else {}))
    raise ConfigError(f"unknown --opt {name!r}: use one of {', '.join(OPTIMIZERS)}")


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
                    final_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-iteration cosine annealing (after a linear warm-up) down to ``final_ratio * lr``."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine_lambda(total_steps, warmup_steps, final_ratio))
    _float_rates(optimizer, scheduler)
    return scheduler


def _float_rates(optimizer: torch.optim.Optimizer, scheduler) -> None:
    """The scheduler's base rates as floats, and the optimizer's rates as floats where they
    were floats: with a tensor rate (``--cuda-graphs``) the scheduler then fills it with a
    float (no read back from the GPU each step); a run resumed without ``--cuda-graphs``
    from one with it steps a float rate again."""
    scheduler.base_lrs = [float(b) for b in scheduler.base_lrs]
    for group in optimizer.param_groups:
        if isinstance(group.get("initial_lr"), torch.Tensor):
            group["initial_lr"] = float(group["initial_lr"])


def steps_per_epoch(loader, limit: int | None, *, drop_last: bool = False) -> int:
    """Optimizer steps in one epoch (``limit`` caps it); ``drop_last`` (``--cuda-graphs``):
    the last batch does not count when it is partial (the graphed step drops it)."""
    n = len(loader)
    size, data = getattr(loader, "batch_size", None), getattr(loader, "dataset", None)
    if drop_last and n > 1 and size and data is not None and hasattr(data, "__len__") \
            and len(data) % size:
        n -= 1
    return n if limit is None else min(n, limit)


def load_source(path: str | Path, stages: tuple[str, ...], model: str | None, verb: str,
                ckpt: dict[str, Any] | None = None) -> dict[str, Any]:
    """The input checkpoint of ``calibrate``/``qat`` (``ckpt``: already loaded from ``path``),
    checked: finite weights, the stage, and the architecture ``--model`` expects."""
    ckpt = load_checkpoint(path) if ckpt is None else ckpt
    check_finite_arrays(ckpt["state_dict"].items(), f"checkpoint {path}",
                        "train it again with a lower --lr")
    stage = ckpt.get("stage")
    if stage not in stages:
        hint = {"fp32": "calibrate it first: trtqat calibrate --checkpoint " + str(path)}.get(
            stage, f"{verb} needs a checkpoint of stage {' or '.join(stages)}")
        raise CheckpointError(f"{path} holds a {stage!r} checkpoint: {hint}")
    arch = ckpt["model"]["arch"]
    recorded = (ckpt["model"].get("source") or {}).get("model")
    if model is not None and model not in (arch, recorded) and not _same_file(model, recorded):
        raise CheckpointError(f"{path} holds a {arch}, not a {model}: pass the checkpoint of "
                              f"a {model} run, or drop --model")
    return ckpt


def _same_file(model: str, recorded: str | None) -> bool:
    """``my.py:make`` given relative names the absolute ``/path/my.py:make`` recorded."""
    if not recorded or ".py:" not in model:
        return False
    file, _, factory = model.rpartition(":")
    return f"{Path(file).resolve()}:{factory}" == recorded


@dataclasses.dataclass
class Stage:
    """One recipe run as :func:`stage` sets it up: process group, speed options, run folder."""

    ctx: D.DistContext
    acc: accel.Accel | None = None
    out: Path | None = None
    run: RunDir | None = None  # set by the recipe once it opens the folder: closed on exit


@contextlib.contextmanager
def stage(cfg: Any, *, resume: bool = False, inputs: Iterable[tuple[str, object]] = (),
          graphs: bool = False) -> Iterator[Stage]:
    """Set up a recipe run (``D.setup``, ``Accel.setup``, the ``--out`` guard) and close it
    all on exit, however the run ends. Bad speed options are refused before ``--out`` is
    touched; ``graphs``: the recipe supports ``--cuda-graphs``."""
    model = getattr(cfg, "model", None)
    if isinstance(model, str) and ".py:" in model:  # a model file may not be in --out either
        inputs = [*inputs, ("--model", model.rpartition(":")[0])]
    st = Stage(D.setup(cfg.device))
    guard = None
    try:
        st.acc = accel.Accel.setup(cfg, st.ctx.device, graphs=graphs)
        guard = RunGuard(cfg.out, resume, cfg.overwrite, enabled=st.ctx.is_main,
                         inputs=list(inputs))
        st.out = guard.path
        yield st
    finally:
        if st.run is not None:
            st.run.close()
        if guard is not None:
            guard.close()
        D.cleanup(st.ctx)


def load_resume(out: Path, stage: str, args: dict[str, Any], ctx: D.DistContext
                ) -> dict[str, Any]:
    """``out/last.pt`` after checking it continues this very run (same stage and options)."""
    ckpt = load_checkpoint(out / "last.pt")
    if ckpt.get("stage") != stage:
        raise CheckpointError(f"--resume: {out}/last.pt is a {ckpt.get('stage')!r} run, not "
                              f"{stage!r}; use the command that wrote it")
    old = ckpt.get("args") or {}
    diff = [k for k, v in args.items() if k not in RESUME_FREE and k in old and old[k] != v]
    if diff:
        k = diff[0]
        raise ConfigError(f"--resume: --{k.replace('_', '-')} is {args[k]!r} but the run used "
                          f"{old[k]!r}; resume with the options of the original command")
    rng = ckpt.get("rng") or []
    if len(rng) != ctx.world_size:
        log.warning("resuming with %d process(es), the run used %d: data order and "
                    "augmentation will differ from an uninterrupted run", ctx.world_size,
                    len(rng))
    return ckpt


def restore(ckpt: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
            scheduler, ctx: D.DistContext) -> tuple[int, float, float]:
    """Load a resume checkpoint into the live objects; returns (epoch, best top-1, wall time)."""
    model.load_state_dict(accel.strip_compiled_prefix(ckpt["state_dict"]))
    tensor_lr = [isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups]
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    _float_rates(optimizer, scheduler)
    for group, was_tensor in zip(optimizer.param_groups, tensor_lr):
        if not was_tensor and isinstance(group["lr"], torch.Tensor):
            group["lr"] = float(group["lr"])  # the graphed step pins tensor rates itself
    rng = ckpt.get("rng") or []
    if ctx.rank < len(rng):
        D.set_rng_state(rng[ctx.rank])
    return int(ckpt["epoch"]), float(ckpt.get("best_top1", -1.0)), float(
        ckpt.get("wall_time_s", 0.0))


def payload(*, stage: str, model: nn.Module, spec: dict[str, Any], epoch: int,
            args: dict[str, Any], ctx: D.DistContext, metrics: dict[str, Any],
            optimizer: torch.optim.Optimizer | None = None, scheduler=None,
            best_top1: float = -1.0, wall_time_s: float = 0.0, **extra: Any) -> dict[str, Any]:
    """A checkpoint dict (plain types and tensors). Runs a collective: call on every rank."""
    ckpt = {"stage": stage, "model": spec, "state_dict": accel.plain_state_dict(model),
            "epoch": epoch, "rng": D.gather_rng_states(ctx), "metrics": metrics,
            "best_top1": best_top1, "wall_time_s": wall_time_s, "args": args, **extra}
    if optimizer is not None:
        ckpt["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        ckpt["scheduler"] = scheduler.state_dict()
    return ckpt


def num_classes_for(requested: int | None, data_classes: int) -> int:
    """The model's class count: ``--num-classes`` if given (>= the data's), else the data's."""
    if requested is None:
        return data_classes
    if requested < data_classes:
        raise ConfigError(f"--num-classes {requested} is smaller than the {data_classes} "
                          "classes of the data set")
    return requested


__all__ = ["ConfigError", "check_positive", "flag"]

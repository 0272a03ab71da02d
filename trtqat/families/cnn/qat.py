"""QAT of an image classifier: the CNN family's half of ``trtqat qat``.

Default recipe (TensorRT's guidance, :mod:`trtqat.runs.qat_recipe`): about 10% of the FP32
schedule's epochs (at least 1), starting at 1% of its learning rate, cosine-annealed per
iteration down to 1% of that starting rate. The FP32 run's options travel in the calibrated
checkpoint (``train_args``). BatchNorm stays in training mode, as in standard QAT.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from torch import nn

from trtqat.errors import QuantizerStateError
from trtqat.families.cnn.data_sources import preprocess_of
from trtqat.families.cnn.fp32 import top1_or_none
from trtqat.families.cnn.graphs import graphed_step
from trtqat.families.types import StageResult
from trtqat.outputs import scoring
from trtqat.quant.model_ops import disable_layers, quantizers
from trtqat.runopts import FP32_DEFAULTS
from trtqat.runs import distributed as D
from trtqat.runs import recipes as R
from trtqat.runs.checkpoint import CheckpointError
from trtqat.runs.health import kept_message
from trtqat.runs.loop import NonFiniteLossError, evaluate, fit
from trtqat.runs.qat_recipe import qat_recipe
from trtqat.runs.run_dir import RunDir

if TYPE_CHECKING:
    from trtqat.stages.qat import QATConfig

log = logging.getLogger(__name__)


def classifier_recipe(cfg: QATConfig, train_args: dict[str, Any]) -> dict[str, Any]:
    """Every schedule option of an image classifier's QAT, filled in from the FP32 run's
    ``train_args`` (then the model's FP32 recipe, ``train_recipes``); the loss is "ce"."""
    from trtqat.families.cnn.train_recipes import train_recipe

    defaults = {**FP32_DEFAULTS,
                **train_recipe(train_args.get("model") or getattr(cfg, "model", None))}
    fp32 = {k: train_args.get(k, defaults[k]) for k in
            ("epochs", "lr", "momentum", "weight_decay", "opt", "label_smoothing", "data",
             "image_size", "batch_size")}
    recipe = qat_recipe(fp32["epochs"], fp32["lr"], epochs=cfg.epochs, lr=cfg.lr,
                        min_lr=cfg.min_lr)
    pick = {k: getattr(cfg, k) if getattr(cfg, k) is not None else fp32[k]
            for k in ("momentum", "weight_decay", "opt", "label_smoothing", "data",
                      "image_size", "batch_size")}
    return {"epochs": recipe.epochs, "lr": recipe.lr, "min_lr": recipe.min_lr, **pick,
            "fp32_epochs": fp32["epochs"], "fp32_lr": fp32["lr"], "loss": "ce"}


def _check_calibrated(model: nn.Module, path: str) -> None:
    missing = [n for n, q in quantizers(model) if not q.disabled and q.amax is None]
    if missing:
        raise QuantizerStateError(f"{path}: {len(missing)} quantizer(s) have no amax (e.g. "
                                  f"{missing[0]}); calibrate the model first (trtqat calibrate)")


def finetune_classifier(cfg: QATConfig, family: Any, src: dict[str, Any]) -> StageResult:
    """QAT of an image classifier of ``family`` (``src``: the loaded calibrated checkpoint):
    the stage code of :meth:`trtqat.families.cnn.CNNFamily.run_qat`. The result's ``best``
    is the best val top-1, ``before`` the calibrated model's."""
    with R.stage(cfg, resume=cfg.resume, inputs=[("--checkpoint", cfg.checkpoint)],
                 graphs=True) as st:
        ctx, acc, out = st.ctx, st.acc, st.out
        src = R.load_source(cfg.checkpoint, ("ptq", "qat"), cfg.model, "qat", src)
        spec = dict(src["model"])
        train_args = dict(src.get("train_args") or {})
        if not train_args:
            if cfg.data is None:
                raise R.ConfigError(f"{cfg.checkpoint} was calibrated from a float model, not "
                                    "a `trtqat train` run, so QAT has no training data to "
                                    "inherit: pass --data (an ImageFolder with train/ and "
                                    "val/, or digits)")
        r = family.recipe("qat", cfg, src)
        if not train_args and (cfg.epochs is None or cfg.lr is None):
            log.warning("%s records no FP32 training run, so QAT assumes `trtqat train`'s "
                        "schedule (%s epochs from lr %g): pass --epochs and --lr for your "
                        "model's FP32 training (TensorRT's rule: about 10%% of its epochs "
                        "from 1%% of its learning rate)", cfg.checkpoint, r["epochs"],
                        r["lr"])
        R.check_preprocess_applies(cfg, r["data"])
        prep = preprocess_of(cfg, spec.get("preprocess"), spec.get("image_size")
                             or r["image_size"])
        r["image_size"] = prep.image_size
        D.seed_everything(cfg.seed, ctx.rank)
        batches = family.data(cfg, "train", data=r["data"], prep=prep,
                              batch_size=r["batch_size"],
                              num_classes=train_args.get("num_classes"),
                              distributed=ctx.distributed)
        if batches.classes > int(spec["num_classes"]):
            raise CheckpointError(f"the data has {batches.classes} classes but the "
                                  f"checkpoint's {spec['arch']} predicts {spec['num_classes']}")
        recorded = {k: v for k, v in r.items() if k != "loss"}
        args = R.as_args(cfg, model=(spec.get("source") or {}).get("model", spec["arch"]),
                         world_size=ctx.world_size, resize=prep.resize, mean=prep.mean,
                         std=prep.std, channels=prep.channels, **recorded)
        spec.update(image_size=prep.image_size, preprocess=prep.to_dict(), family=family.name)
        resume_ckpt = R.load_resume(out, "qat", args, ctx) if cfg.resume else None
        model = family.load(src).to(ctx.device)
        which = cfg.metric_output or spec.get("metric_output")
        model.register_forward_hook(scoring(which))  # several outputs: the one trained on
        if which:
            spec["metric_output"] = which
        if cfg.skip_layers:  # left in float for fine-tuning; recorded with the calibrate-time ones
            disable_layers(model, cfg.skip_layers)
            spec["skip_layers"] = list(dict.fromkeys([*(spec.get("skip_layers") or []),
                                                      *cfg.skip_layers]))
        _check_calibrated(model, str(cfg.checkpoint))
        acc.prepare(model)
        fast = acc.compiled(model)  # shares model's parameters; checkpoints come from model
        optimizer = R.build_optimizer(r["opt"], model, r["lr"], r["momentum"],
                                      r["weight_decay"], graphs=acc.cuda_graphs)
        steps = R.steps_per_epoch(batches.train, cfg.limit_batches, drop_last=acc.cuda_graphs)
        scheduler = R.build_scheduler(optimizer, steps * r["epochs"], 0, r["min_lr"] / r["lr"])
        criterion = nn.CrossEntropyLoss(label_smoothing=r["label_smoothing"])
        start, best, wall = 0, -1.0, 0.0
        start_top1 = (src.get("metrics") or {}).get("val_top1")
        if resume_ckpt is not None:
            start, best, wall = R.restore(resume_ckpt, model, optimizer, scheduler, ctx)
            acc.load_checkpoint_state(resume_ckpt)
        graphed = graphed_step(model, criterion, optimizer, acc)
        st.run = run = RunDir(out, enabled=ctx.is_main)
        extra = {"calib": src.get("calib"), "train_args": train_args}
        if cfg.resume:
            run.start(args, resume=True)
            run.truncate_metrics("qat", start, (resume_ckpt or {}).get("metrics"))
        else:
            t0 = time.perf_counter()
            va = evaluate(fast, batches.val, ctx, criterion=criterion, limit=cfg.limit_batches,
                          progress=cfg.progress, desc="val start", accel=acc)
            start_top1 = va["top1"]
            run.start(args, resume=False)
            run.log_metrics({"stage": "qat", "epoch": 0, "epochs": r["epochs"],
                             "val_loss": va["loss"], "val_top1": va["top1"],
                             "val_top5": va["top5"], "lr": r["lr"],
                             "wall_time_s": time.perf_counter() - t0,
                             "time": time.strftime("%Y-%m-%dT%H:%M:%S")})

        def make_payload(epoch: int, record: dict, best_top1: float, wall_s: float) -> dict:
            return R.payload(stage="qat", model=model, spec=spec, epoch=epoch, args=args,
                             ctx=ctx, metrics=record, optimizer=optimizer, scheduler=scheduler,
                             best_top1=best_top1, wall_time_s=wall_s, **extra,
                             **acc.checkpoint_state())

        try:
            result = fit(stage="qat", model=D.wrap(ctx, fast), train_loader=batches.train,
                         val_loader=batches.val, criterion=criterion, optimizer=optimizer,
                         scheduler=scheduler, ctx=ctx, run=run, start_epoch=start,
                         epochs=r["epochs"], best_top1=best, wall_offset=wall,
                         payload=make_payload, limit=cfg.limit_batches,
                         stop_after=cfg.stop_after, progress=cfg.progress, accel=acc,
                         graphed=graphed)
        except NonFiniteLossError as exc:
            raise NonFiniteLossError(f"{exc}; stopped. {kept_message(out, run)} Lower --lr and start "
                                     "again (--overwrite)") from None
        return StageResult("qat", str(out), result["last"],
                           best=top1_or_none(result["best_top1"]), before=start_top1)

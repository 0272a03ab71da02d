"""``trtqat train``: FP32 training of a torchvision classification model.

Also holds the option groups shared by ``calibrate`` and ``qat``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from typing import Any

from trtqat.cli.validate import (
    BadValue,
    finite_float,
    int_range,
    non_negative_int,
    positive_int,
    seed_int,
    writable_dir,
)

EPILOG_DIST = ("Several processes: torchrun --nproc_per_node=N -m trtqat {cmd} ... "
               "(DistributedDataParallel; gloo on CPU, nccl on GPU; rank 0 writes the run).")


def formatter(prog: str) -> argparse.HelpFormatter:
    """Help that shows defaults and keeps the epilog's line breaks."""

    class _F(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        def _get_help_string(self, action: argparse.Action) -> str:
            if action.default is None or isinstance(action.default, bool):
                return action.help or ""
            return super()._get_help_string(action)

    return _F(prog, max_help_position=32)


def fill(text: str) -> str:
    """Wrap a description for help output (the formatter keeps raw line breaks)."""
    return textwrap.fill(text, 88, break_on_hyphens=False)


def csv(text: str) -> tuple[str, ...]:
    """Parse 'a,b,c' into a tuple of names."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


def image_size_arg(text: str) -> int | tuple[int, int]:
    """argparse type of --image-size/--resize: N or HxW."""
    from trtqat.train.data_sources import DataSourceError, parse_size

    try:
        return parse_size(text)
    except DataSourceError as exc:  # a refused value: exit 1 like every validator's
        raise BadValue(str(exc).split(": ", 1)[-1]) from None


def add_model_source_args(g: argparse._ArgumentGroup) -> None:
    """--weights (the float weights of --model)."""
    g.add_argument("--weights", default=None, metavar="FILE|NAME",
                   help="float weights of --model: a state_dict or checkpoint file "
                   "(.pt/.pth), or a torchvision weights name (IMAGENET1K_V1, DEFAULT) "
                   "found in the torch hub cache (never downloaded)")


def add_data_args(p: argparse.ArgumentParser, inherit: bool = False,
                  calibration: bool = False) -> None:
    """--data, --image-size, preprocessing, --batch-size, --workers, --seed, --strict."""
    g = p.add_argument_group("data" + (" (default: as in the FP32 run)" if inherit else ""))
    extra = (", a flat folder of images, or a .npy/.npz (N,C,H,W) float array "
             "(FILE.npz:NAME picks one; no labels: calibration only)") if calibration else ""
    g.add_argument("--data", default=None if inherit else "digits", metavar="digits|synthetic|PATH",
                   help="'digits' (scikit-learn's 8x8 digits, resized), 'synthetic' (random, "
                   f"for speed runs) or an ImageFolder PATH with train/ and val/{extra}")
    g.add_argument("--image-size", type=image_size_arg, default=None if inherit else 32,
                   metavar="N|HxW", help="input resolution: N (square) or HxW, e.g. 224x160")
    g.add_argument("--resize", default=None, metavar="N|HxW|auto",
                   help="image folders: resize before the center crop, the shorter side to N "
                   "or exactly HxW (default auto: shorter side to image size / 0.875)")
    g.add_argument("--mean", default=None, metavar="M[,M,M]",
                   help="normalization mean per channel (default: ImageNet's)")
    g.add_argument("--std", default=None, metavar="S[,S,S]",
                   help="normalization std per channel (default: ImageNet's)")
    g.add_argument("--channels", type=int, choices=[1, 3], default=None,
                   help="image channels: 3 (RGB, default) or 1 (grayscale)")
    g.add_argument("--batch-size", "-b", type=positive_int, default=None if inherit else 32,
                   help="batch size per process")
    g.add_argument("--workers", "-j", type=non_negative_int, default=0,
                   help="data loader processes")
    g.add_argument("--seed", type=seed_int, default=0, help="random seed (shuffling, augmentation)")
    g.add_argument("--strict", action="store_true",
                   help="fail on unreadable images instead of skipping them with a warning")


def add_run_args(p: argparse.ArgumentParser, out: str, resumable: bool = True) -> None:
    """--out, --resume, --overwrite, --device, --limit-batches, --stop-after, --no-progress,
    and the speed options of :func:`add_accel_args`."""
    g = p.add_argument_group("run")
    g.add_argument("--out", "-o", default=out, metavar="RUN_DIR", type=writable_dir,
                   help="run folder: args.yaml, metrics.jsonl, last.pt, best.pt")
    if resumable:
        g.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its last.pt (same options)")
        g.add_argument("--stop-after", type=positive_int, default=None, metavar="EPOCHS",
                       help="stop after this epoch, as if interrupted (continue with --resume)")
    g.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--limit-batches", type=positive_int, default=None, metavar="N",
                   help="use at most N batches per epoch for train and val (quick checks)")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars or per-epoch lines")
    add_accel_args(p)


def add_accel_args(p: argparse.ArgumentParser) -> None:
    """--amp, --channels-last, --compile (trtqat.train.accel; CNNs and encoders alike)."""
    g = p.add_argument_group("speed (checkpoints stay float32)")
    g.add_argument("--amp", choices=["bf16", "fp16"], default=None,
                   help="mixed precision: autocast the forward in bfloat16 or float16 (fp16: "
                   "GPU only, with a gradient scaler)")
    g.add_argument("--channels-last", action="store_true",
                   help="NHWC weights and image batches (faster convolutions on GPUs; no "
                   "effect on encoders)")
    g.add_argument("--compile", action="store_true",
                   help="run the model through torch.compile (calibrate: evaluation only; "
                   "statistics are collected eagerly)")


def add_optim_args(p: argparse.ArgumentParser, inherit: bool = False) -> None:
    """--lr, --min-lr, --momentum, --weight-decay, --opt, --label-smoothing."""
    g = p.add_argument_group("optimizer" + (" (default: derived from the FP32 run)"
                                            if inherit else ""))
    g.add_argument("--lr", type=finite_float(gt=0), default=None if inherit else 0.05,
                   help="peak learning rate"
                   + (" (default: 1%% of the FP32 lr)" if inherit else ""))
    g.add_argument("--min-lr", type=finite_float(ge=0), default=None if inherit else 0.0,
                   help="final learning rate of the cosine schedule"
                   + (" (default: 1%% of --lr)" if inherit else ""))
    g.add_argument("--momentum", type=finite_float(ge=0, lt=1), default=None if inherit else 0.9,
                   help="SGD momentum (Nesterov)")
    g.add_argument("--weight-decay", "--wd", type=finite_float(ge=0),
                   default=None if inherit else 5e-4,
                   help="weight decay")
    g.add_argument("--opt", choices=["sgd", "adamw"], default=None if inherit else "sgd",
                   help="optimizer")
    g.add_argument("--label-smoothing", type=finite_float(ge=0, lt=1),
                   default=None if inherit else 0.0,
                   help="label smoothing of the cross-entropy loss")


def config_from(cls: type, args: argparse.Namespace) -> Any:
    """Build the recipe config ``cls`` from the parsed options of the same names."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if hasattr(args, f.name)}
    return cls(**values)


def report(stage: str, result: dict[str, Any]) -> None:
    """One closing line on stderr (rank 0 only)."""
    import os

    if os.environ.get("RANK", "0") != "0":
        return
    best = result.get("best_top1")
    text = f"{stage}: best val top-1 {best:.2f}%" if best is not None and best >= 0 else stage
    print(f"{text}; run folder {result['out']}", file=sys.stderr)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat train`` to the command line."""
    p = subparsers.add_parser(
        "train", help="FP32 training of a torchvision classification model",
        description=fill(
            "Train a torchvision classification model in FP32 with SGD and a "
        "per-iteration cosine schedule. Writes RUN_DIR/{args.yaml,metrics.jsonl,last.pt,best.pt}."),
        epilog="example:\n  trtqat train --model resnet18 --data digits --image-size 32 "
        "--epochs 15 --out runs/fp32\n\n" + EPILOG_DIST.format(cmd="train"),
        formatter_class=formatter)
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", default="resnet18",
                   help="torchvision classification model name (resnet18, mobilenet_v2, ...), "
                   "a timm name (resnet50.a1_in1k; needs timm), or path/to/file.py:factory")
    g.add_argument("--num-classes", type=int_range(2), default=None,
                   help="output classes (default: the data set's)")
    add_model_source_args(g)
    add_data_args(p)
    g = p.add_argument_group("schedule")
    g.add_argument("--epochs", type=positive_int, default=15, help="training epochs")
    g.add_argument("--warmup-epochs", type=finite_float(ge=0, unit="epochs"), default=1.0,
                   help="linear warm-up before the cosine decay (at most half the run)")
    add_optim_args(p)
    add_run_args(p, "runs/fp32")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat train``."""
    from trtqat.train.fp32 import TrainConfig, train_fp32

    result = train_fp32(config_from(TrainConfig, args))
    report("train", result)
    return 0

"""``trtqat train``: FP32 training of an image classifier (the model's family trains it)."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli.validate import finite_float

SUMMARY = "FP32 training of an image classifier or a detector"
DESCRIPTION = ("Train an image classifier (torchvision, timm, trtqat's small ViTs, your "
               "file.py:factory) or an object detector (yolo_digits, Ultralytics YOLO) in FP32 "
               "with the model family's recipe (CNNs: SGD with a per-iteration cosine "
               "schedule). Writes RUN_DIR/{args.yaml,metrics.jsonl,last.pt,best.pt}.")
EPILOG = ("examples:\n  trtqat train --model resnet18 --data digits --image-size 32 "
          "--epochs 15 --out runs/fp32\n  trtqat train --model yolo_digits --out runs/det/fp32"
          "\n\n" + O.EPILOG_DIST.format(cmd="train"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat train`` to the command line."""
    p = O.command(subparsers, "train", SUMMARY, DESCRIPTION, EPILOG)
    g = p.add_argument_group("model")
    O.add_model(g, "resnet18", O.families_help(
        "the model to train (timm names need trtqat[timm]), of any family that trains",
        ("classification", "detection")))
    O.add_num_classes(g, "output classes (default: the data set's)")
    O.add_weights(g)
    O.add_data_args(p, recipe_batch=True)
    g = p.add_argument_group("schedule")
    O.add_epochs(g, None, "training epochs (default: the model family's recipe; CNNs: 15, "
                 "ViTs: 30)")
    g.add_argument("--warmup-epochs", type=finite_float(ge=0, unit="epochs"), default=1.0,
                   help="linear warm-up before the cosine decay (at most half the run)")
    O.add_optim_args(p)
    O.add_run_args(p, "runs/fp32")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat train``."""
    from trtqat.stages.train import TrainConfig, train_fp32

    O.print_summary(train_fp32(O.config_from(TrainConfig, args)))
    return 0

"""``trtqat qat``: quantization-aware fine-tuning of a calibrated checkpoint."""

from __future__ import annotations

import argparse

from trtqat.cli.cmd_train import (
    EPILOG_DIST,
    add_data_args,
    add_optim_args,
    add_run_args,
    config_from,
    fill,
    formatter,
    report,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat qat`` to the command line."""
    p = subparsers.add_parser(
        "qat", help="QAT: fine-tune a calibrated checkpoint with fake quantization",
        description=fill(
            "Fine-tune a calibrated (PTQ) checkpoint with fake quantization in the "
        "forward pass. Default recipe (TensorRT's guidance): ~10% of the FP32 run's epochs "
        "(at least 1), starting at 1% of its learning rate, cosine-annealed per iteration "
        "down to 1% of that. Every default can be overridden."),
        epilog="example:\n  trtqat qat --checkpoint runs/ptq/best.pt --out runs/qat\n\n"
        + EPILOG_DIST.format(cmd="qat"),
        formatter_class=formatter)
    g = p.add_argument_group("source")
    g.add_argument("--checkpoint", "-c", required=True, metavar="PATH",
                   help="calibrated checkpoint (a .pt from `trtqat calibrate`, or its run folder)")
    g.add_argument("--model", "-m", default=None,
                   help="expected architecture: fail if the checkpoint holds another one")
    g = p.add_argument_group("schedule")
    g.add_argument("--epochs", type=int, default=None,
                   help="QAT epochs (default: 10%% of the FP32 epochs, at least 1)")
    add_optim_args(p, inherit=True)
    add_data_args(p, inherit=True)
    add_run_args(p, "runs/qat")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat qat``."""
    from trtqat.train.qat import QATConfig, qat_finetune

    result = qat_finetune(config_from(QATConfig, args))
    report("qat", result)
    return 0

"""``trtqat qat``: quantization-aware fine-tuning of a calibrated checkpoint."""

from __future__ import annotations

import argparse

from trtqat.cli.cmd_train import (
    EPILOG_DIST,
    add_data_args,
    add_optim_args,
    add_run_args,
    config_from,
    csv,
    fill,
    formatter,
    report,
)
from trtqat.cli.validate import int_range, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat qat`` to the command line."""
    p = subparsers.add_parser(
        "qat", help="QAT: fine-tune a calibrated checkpoint with fake quantization",
        description=fill(
            "Fine-tune a calibrated (PTQ) checkpoint with fake quantization in the "
        "forward pass. Default recipe (TensorRT's guidance): ~10% of the FP32 run's epochs "
        "(at least 1), starting at 1% of its learning rate, cosine-annealed per iteration "
        "down to 1% of that. Every default can be overridden."),
        epilog="example:\n  trtqat qat --checkpoint runs/ptq/best.pt --out runs/qat\n"
        "  trtqat qat --checkpoint runs/minilm/ptq/best.pt --out runs/minilm/qat\n\n"
        "Encoder checkpoints (from `trtqat calibrate --model minilm`): self-distillation from "
        "the FP32\nreference (cosine loss, AdamW, learned activation ranges); defaults: 3 epochs "
        "over the corpus'\ntraining split (--max-steps N for a quicker run), --lr 1e-4 "
        "cosine-annealed to 1%, --batch-size 32;\nfidelity on its held-out split.\n--resume/--stop-after are CNN-only.\n\n"
        + EPILOG_DIST.format(cmd="qat"),
        formatter_class=formatter)
    g = p.add_argument_group("source")
    g.add_argument("--checkpoint", "-c", required=True, metavar="PATH",
                   help="calibrated checkpoint (a .pt from `trtqat calibrate`, or its run folder)")
    g.add_argument("--model", "-m", default=None,
                   help="expected architecture: fail if the checkpoint holds another one")
    g.add_argument("--skip-layers", type=csv, default=(), metavar="A,B",
                   help="glob patterns of layers kept in float during fine-tuning (added to "
                   "the checkpoint's own), e.g. 'conv1,fc'; see `trtqat sensitivity`")
    g = p.add_argument_group("schedule")
    g.add_argument("--epochs", type=positive_int, default=None,
                   help="QAT epochs (default: 10%% of the FP32 epochs, at least 1)")
    g.add_argument("--max-steps", type=positive_int, default=None,
                   help="encoders: stop after this many optimizer steps")
    g.add_argument("--max-length", type=int_range(2), default=None,
                   help="encoders: tokens per sentence (default: the calibration's)")
    add_optim_args(p, inherit=True)
    add_data_args(p, inherit=True)
    add_run_args(p, "runs/qat")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat qat``."""
    from trtqat.train.qat import QATConfig, qat_finetune

    if _is_encoder(args.checkpoint):
        return _run_encoder(args)
    result = qat_finetune(config_from(QATConfig, args))
    report("qat", result)
    return 0


def _is_encoder(checkpoint: str) -> bool:
    from trtqat.train.checkpoint import load_checkpoint
    from trtqat.transformers.checkpoint import is_encoder_checkpoint

    return is_encoder_checkpoint(load_checkpoint(checkpoint))


def _run_encoder(args: argparse.Namespace) -> int:
    """QAT of an encoder checkpoint (options of CNNs only are refused or ignored)."""
    import logging
    import sys

    from trtqat.train.recipes import ConfigError
    from trtqat.transformers.runs import EncoderQATRunConfig, describe, qat_encoder_run

    for flag in ("resume", "stop_after"):
        if getattr(args, flag, None):
            raise ConfigError(f"--{flag.replace('_', '-')} is not supported for encoder "
                              "checkpoints: start again with --overwrite")
    ignored = [f"--{k.replace('_', '-')}" for k in ("momentum", "opt", "label_smoothing",
                                                     "image_size", "limit_batches")
               if getattr(args, k, None) is not None]
    if ignored:
        logging.getLogger(__name__).warning("%s: CNN options, ignored for an encoder (AdamW)",
                                            ", ".join(ignored))
    result = qat_encoder_run(config_from(EncoderQATRunConfig, args))
    print(describe("qat", result), file=sys.stderr)
    return 0

"""``trtqat qat``: quantization-aware fine-tuning of a calibrated checkpoint."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli.validate import finite_float, positive_int

SUMMARY = "QAT: fine-tune a calibrated checkpoint with fake quantization"
DESCRIPTION = ("Fine-tune a calibrated (PTQ) checkpoint with fake quantization in the "
               "forward pass. Default recipe (TensorRT's guidance): ~10% of the FP32 run's epochs "
               "(at least 1), starting at 1% of its learning rate, cosine-annealed per iteration "
               "down to 1% of that (detectors: 20% of the epochs at 10% of the learning "
               "rate). Every default can be overridden.")
EPILOG = ("example:\n  trtqat qat --checkpoint runs/ptq/best.pt --out runs/qat\n"
          "  trtqat qat --checkpoint runs/minilm/ptq/best.pt --out runs/minilm/qat\n\n"
          "Encoder checkpoints (from `trtqat calibrate --model minilm`): self-distillation from "
          "the FP32\nreference (cosine loss, AdamW, learned activation ranges); defaults: 3 "
          "epochs over the corpus'\ntraining split (--max-steps N for a quicker run), --lr 1e-4 "
          "cosine-annealed to 1%, --batch-size 32;\nfidelity on its held-out split.\n"
          "--resume/--stop-after are CNN-only.\n\n" + O.EPILOG_DIST.format(cmd="qat"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat qat`` to the command line."""
    p = O.command(subparsers, "qat", SUMMARY, DESCRIPTION, EPILOG)
    g = p.add_argument_group("source")
    O.add_checkpoint(g, required=True, help="calibrated checkpoint (a .pt from `trtqat "
                     "calibrate`, or its run folder)")
    O.add_model(g, help="expected architecture: fail if the checkpoint holds another one")
    O.add_skip_layers(g, "glob patterns of layers kept in float during fine-tuning (added to "
                      "the checkpoint's own), e.g. 'conv1,fc'; see `trtqat sensitivity`")
    O.add_format(g, qat=True)
    g = p.add_argument_group("schedule")
    O.add_epochs(g, None, "QAT epochs (default: the family's share of the FP32 epochs, at least "
                 "1; CNNs: 10%%, ViTs: 20%%)")
    g.add_argument("--max-steps", type=positive_int, default=None,
                   help="encoders: stop after this many optimizer steps")
    O.add_max_length(g, None, "encoders: tokens per sentence (default: the calibration's)")
    g.add_argument("--distill", type=finite_float(ge=0), default=None, metavar="WEIGHT",
                   help="detectors: add WEIGHT x a distillation loss from the FP32 model "
                   "(its class scores and box distances) to the detection loss (default: 0, "
                   "off)")
    O.add_optim_args(p, inherit=True)
    O.add_data_args(p, inherit=True)
    O.add_run_args(p, "runs/qat")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat qat``."""
    from trtqat.stages.qat import QATConfig, qat_finetune

    O.print_summary(qat_finetune(O.config_from(QATConfig, args)))
    return 0

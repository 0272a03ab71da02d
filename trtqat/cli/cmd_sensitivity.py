"""``trtqat sensitivity``: rank quantized layers by their effect on accuracy."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli.validate import non_negative_int, positive_int

SUMMARY = "rank quantized layers by their accuracy cost; suggest which to leave in float"
DESCRIPTION = (
    "Evaluate a calibrated (ptq/qat) checkpoint on validation batches held in memory with one "
    "layer switched at a time: --mode one-on quantizes only that layer (harm vs FP32), one-off "
    "quantizes every layer but that one (recovery vs fully quantized). Ranks the layers, prints "
    "the top offenders and the time taken, and writes sensitivity.json and sensitivity.png.")
EPILOG = ("examples:\n  trtqat sensitivity --checkpoint runs/ptq/best.pt\n"
          "  trtqat sensitivity -c runs/ptq/best.pt --mode one-off --metric loss --suggest 2\n\n"
          "A layer is a module owning quantizers (layer1.0.conv1) or a standalone quantizer\n"
          "(layer1.0.residual_quantizer); pass those names to --skip-layers of calibrate, qat\n"
          "and export.")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat sensitivity`` to the command line."""
    p = O.command(subparsers, "sensitivity", SUMMARY, DESCRIPTION, EPILOG)
    O.add_checkpoint(p, required=True, help="calibrated checkpoint (a .pt of calibrate/qat, or "
                     "its run folder)")
    p.add_argument("--mode", choices=["one-on", "one-off"], default="one-on",
                   help="one-on: only that layer quantized; one-off: all but that layer")
    p.add_argument("--metric", choices=["top1", "loss", "output-mse"], default="top1",
                   help="ranking metric (ties broken by loss, then output MSE)")
    O.add_limit_batches(p, "validation batches to use (default: the whole split)",
                        dest="batches", alias="--batches")
    O.add_batch_size(p, None, "images per batch (default: the checkpoint's)")
    O.add_data(p, None, "validation data (default: the checkpoint's)")
    O.add_image_size(p, None, "input resolution (default: the checkpoint's)")
    p.add_argument("--suggest", type=non_negative_int, default=0, metavar="K",
                   help="pick the K top-ranked layers to leave in float, evaluate that model "
                   "and print the commands that apply it")
    p.add_argument("--top", type=positive_int, default=10, help="layers shown in the table")
    O.add_out(p, None, "output folder (default: <checkpoint folder>/sensitivity)", metavar="DIR")
    p.add_argument("--no-cache", dest="cache", action="store_false",
                   help="full forward passes instead of re-running only what is downstream "
                   "of each layer (same numbers, slower)")
    O.add_device(p, "cpu, auto, cuda or cuda:N", default="cpu")
    O.add_no_progress(p, "no progress bar")
    O.add_threads(p)
    O.add_metric_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat sensitivity``."""
    from trtqat.stages.sensitivity import SensitivityConfig, sensitivity
    from trtqat.stages.sensitivity_report import format_suggestion, format_table

    result = sensitivity(O.config_from(SensitivityConfig, args))
    print(format_table(result, args.top))
    if result.suggestion:
        print(format_suggestion(result))
    print(f"{result.config['layers']} layers x {result.images} images ({result.config['mode']}, "
          f"{result.engine} path) in {result.time_s:.1f}s; wrote {result.paths['json']} and "
          f"{result.paths['png']}")
    return 0

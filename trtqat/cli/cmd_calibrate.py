"""``trtqat calibrate``: post-training quantization (PTQ) of an FP32 checkpoint."""

from __future__ import annotations

import argparse

from trtqat.cli.cmd_train import (
    EPILOG_DIST,
    add_data_args,
    add_run_args,
    config_from,
    csv,
    fill,
    formatter,
    report,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat calibrate`` to the command line."""
    p = subparsers.add_parser(
        "calibrate", help="PTQ: quantize an FP32 checkpoint and calibrate its ranges (amax)",
        description=fill(
            "Load an FP32 checkpoint, insert quantizers, collect activation "
        "histograms on --num-batches training batches (eval transforms), compute amax with "
        "--method, evaluate, and save the calibrated checkpoint (stage 'ptq')."),
        epilog="example:\n  trtqat calibrate --checkpoint runs/fp32/best.pt --method entropy "
        "--out runs/ptq\n\n" + EPILOG_DIST.format(cmd="calibrate")
        + "\nStatistics are merged across processes: every rank holds the same amax.",
        formatter_class=formatter)
    g = p.add_argument_group("calibration")
    g.add_argument("--checkpoint", "-c", required=True, metavar="PATH",
                   help="FP32 checkpoint (a .pt from `trtqat train`, or its run folder)")
    g.add_argument("--method", choices=["max", "percentile", "mse", "entropy"],
                   default="entropy", help="how amax is computed from the activation histograms")
    g.add_argument("--percentile", type=float, default=99.99,
                   help="percentile kept by --method percentile")
    g.add_argument("--num-batches", type=int, default=16,
                   help="calibration batches per process")
    g.add_argument("--skip-layers", type=csv, default=(), metavar="A,B",
                   help="glob patterns of layers kept in float, e.g. 'conv1,fc'")
    g.add_argument("--model", "-m", default=None,
                   help="expected architecture: fail if the checkpoint holds another one")
    add_data_args(p, inherit=True)
    add_run_args(p, "runs/ptq", resumable=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat calibrate``."""
    from trtqat.train.ptq import CalibrateConfig, calibrate

    result = calibrate(config_from(CalibrateConfig, args))
    report(f"calibrate ({args.method})", result)
    return 0

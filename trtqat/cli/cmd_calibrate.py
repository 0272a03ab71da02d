"""``trtqat calibrate``: post-training quantization (PTQ) of an FP32 checkpoint."""

from __future__ import annotations

import argparse
import sys

from trtqat.cli.cmd_train import (
    EPILOG_DIST,
    add_data_args,
    add_model_source_args,
    add_run_args,
    config_from,
    csv,
    fill,
    formatter,
    report,
)
from trtqat.cli.validate import finite_float, int_range, positive_int, writable_dir
from trtqat.quant.calib.registry import methods


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat calibrate`` to the command line."""
    p = subparsers.add_parser(
        "calibrate", help="PTQ: quantize an FP32 checkpoint and calibrate its ranges (amax)",
        description=fill(
            "Load an FP32 checkpoint (or any float model: --model NAME|FILE.py:FACTORY "
            "--weights FILE), insert quantizers, collect activation "
        "histograms on --num-batches training batches (eval transforms), compute amax with "
        "--method, evaluate, and save the calibrated checkpoint (stage 'ptq')."),
        epilog="example:\n  trtqat calibrate --checkpoint runs/fp32/best.pt --method entropy "
        "--out runs/ptq\n  trtqat calibrate --model my_net.py:make --weights my_net.pt "
        "--data calib_images/ --image-size 224 --out runs/ptq\n  trtqat calibrate --model minilm --data builtin --out runs/minilm/ptq"
        "\n\nSentence encoders (--model minilm or a Hugging Face BERT-family folder, no "
        "--checkpoint): PTQ on the\ncorpus' training split, embedding fidelity (mean cosine, "
        "Spearman vs FP32) on its held-out split;\nthe FP32 reference checkpoint goes to the "
        "sibling folder fp32/ (--fp32-out).\n\n" + EPILOG_DIST.format(cmd="calibrate")
        + "\nStatistics are merged across processes: every rank holds the same amax.",
        formatter_class=formatter)
    g = p.add_argument_group("calibration")
    g.add_argument("--checkpoint", "-c", default=None, metavar="PATH",
                   help="FP32 checkpoint (a .pt from `trtqat train`, or its run folder); "
                   "required for CNNs, optional for encoders (--model)")
    g.add_argument("--method", choices=methods(),
                   default=None, help="how amax is computed from the activation histograms "
                   "(default: entropy for CNNs, mse for encoders)")
    g.add_argument("--percentile", type=finite_float(gt=0, le=100, unit="percent"), default=99.99,
                   help="percentile kept by --method percentile")
    g.add_argument("--num-batches", type=positive_int, default=16,
                   help="calibration batches per process")
    g.add_argument("--skip-layers", type=csv, default=(), metavar="A,B",
                   help="glob patterns of layers kept in float, e.g. 'conv1,fc'")
    g.add_argument("--model", "-m", default=None,
                   help="CNN without --checkpoint: the float model to start from (torchvision "
                   "or timm name, or path/to/file.py:factory); with --checkpoint: the expected "
                   "architecture; encoder: 'minilm' or a Hugging Face BERT-family folder")
    add_model_source_args(g)
    g.add_argument("--num-classes", type=int, default=None,
                   help="with --model: output classes (default: the model's own)")
    g = p.add_argument_group("encoders (--model minilm|FOLDER; --data builtin|FILE.txt, "
                             "default builtin)")
    g.add_argument("--num-sentences", type=positive_int, default=512,
                   help="calibration sentences from the corpus' training split")
    g.add_argument("--max-length", type=int_range(2), default=128,
                   help="tokens per sentence (truncation)")
    g.add_argument("--fp32-out", default=None, metavar="RUN_DIR", type=writable_dir,
                   help="where the FP32 reference checkpoint goes (default: OUT/../fp32)")
    add_data_args(p, inherit=True, calibration=True)
    add_run_args(p, "runs/ptq", resumable=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat calibrate``."""
    from trtqat.train.ptq import CalibrateConfig, calibrate

    if _encoder_route(args):
        from trtqat.transformers.runs import (
            DEFAULT_METHOD,
            EncoderCalibrateConfig,
            calibrate_encoder_run,
            describe,
        )

        args.method = args.method or DEFAULT_METHOD
        result = calibrate_encoder_run(config_from(EncoderCalibrateConfig, args))
        print(describe(f"calibrate ({args.method})", result), file=sys.stderr)
        return 0
    args.method = args.method or "entropy"
    result = calibrate(config_from(CalibrateConfig, args))
    report(f"calibrate ({args.method})", result)
    return 0


def _encoder_route(args: argparse.Namespace) -> bool:
    """Encoder PTQ: ``--model`` names one (no --checkpoint), or the checkpoint holds one."""
    from trtqat.transformers.runs import is_encoder_name

    if not args.checkpoint:
        if args.model and ".py" in args.model:  # a CNN factory, path/to/file.py:make
            return False
        return is_encoder_name(args.model)
    from trtqat.train.checkpoint import load_checkpoint
    from trtqat.transformers.checkpoint import is_encoder_checkpoint

    return is_encoder_checkpoint(load_checkpoint(args.checkpoint))

"""``trtqat demo``: the whole pipeline on the bundled digits data (the README's main job)."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli import validate as V
from trtqat.engines.registry import backends_help, default_backend


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat demo`` to the command line."""
    p = subparsers.add_parser(
        "demo", help="the whole pipeline on the bundled digits data: train, PTQ, QAT, export, "
        "engines, benchmark, report",
        description="FP32 training of ResNet18 on scikit-learn's digits (32x32), PTQ with every "
        "calibrator (max, percentile 99.9/99.99, MSE, entropy), QAT from the best PTQ model, "
        "export of every ONNX variant, engines, trtexec-style benchmark and a report "
        "(report.md, report.json, report.png). Finished stages are reused unless --fresh.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    O.add_model(p, "resnet18", "image classifier of any image family: a torchvision or timm "
                "name, path/to/file.py:factory, or vit (a small Vision Transformer)")
    O.add_data(p, "digits", "digits, synthetic or an ImageFolder path", metavar=None)
    O.add_image_size(p, 32, "input resolution: N (square) or HxW, at least 8")
    p.add_argument("--epochs", type=V.positive_int, default=None,
                   help="FP32 training epochs (default: the family's recipe, 15 for CNNs, 30 "
                   "for Vision Transformers)")
    p.add_argument("--calib-batches", type=V.positive_int, default=8,
                   help="batches per PTQ calibration")
    p.add_argument("--runs", default="runs/demo", type=V.writable_dir,
                   help="folder of the training run folders")
    p.add_argument("--export-dir", default="export", type=V.writable_dir,
                   help="where the ONNX variants go")
    O.add_out(p, "engines", "where engines and the report go", metavar=None)
    p.add_argument("--backend", default=default_backend(), help=backends_help())
    p.add_argument("--batch-sizes", type=V.int_list, default=(1, 32),
                   help="latency at the first, throughput at the last")
    p.add_argument("--duration", type=V.finite_float(gt=0, unit="seconds"), default=1.0,
                   dest="duration_s",
                   help="seconds of measurement per variant and batch size")
    p.add_argument("--threads", type=V.non_negative_int, default=None,
                   help="ONNX Runtime intra-op threads")
    O.add_device(p, "where training, calibration and QAT run: auto, cpu, cuda or cuda:N "
                 "(engines: --backend tensorrt on a GPU)")
    p.add_argument("--fresh", action="store_true", help="redo every stage")
    O.add_no_progress(p, "no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat demo``."""
    from trtqat.demo import DemoConfig, run_demo

    report = run_demo(O.config_from(DemoConfig, args))
    return 1 if report.get("partial") else 0

"""``trtqat demo``: the whole pipeline on the bundled digits data (the README's main job)."""

from __future__ import annotations

import argparse

from trtqat.cli.validate import (
    finite_float,
    int_list,
    non_negative_int,
    positive_int,
    writable_dir,
)


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
    p.add_argument("--model", default="resnet18", help="torchvision classification model")
    p.add_argument("--data", default="digits", help="digits, synthetic or an ImageFolder path")
    p.add_argument("--image-size", type=positive_int, default=32)
    p.add_argument("--epochs", type=positive_int, default=15, help="FP32 training epochs")
    p.add_argument("--calib-batches", type=positive_int, default=8,
                   help="batches per PTQ calibration")
    p.add_argument("--runs", default="runs/demo", type=writable_dir,
                   help="folder of the training run folders")
    p.add_argument("--export-dir", default="export", type=writable_dir,
                   help="where the ONNX variants go")
    p.add_argument("--out", default="engines", type=writable_dir,
                   help="where engines and the report go")
    p.add_argument("--backend", default="ort", help="ort or tensorrt")
    p.add_argument("--batch-sizes", type=int_list, default=(1, 32),
                   help="latency at the first, throughput at the last")
    p.add_argument("--duration", type=finite_float(gt=0, unit="seconds"), default=1.0,
                   dest="duration_s",
                   help="seconds of measurement per variant and batch size")
    p.add_argument("--threads", type=non_negative_int, default=None,
                   help="ONNX Runtime intra-op threads")
    p.add_argument("--device", default="auto",
                   help="where training, calibration and QAT run: auto, cpu, cuda or cuda:N "
                   "(engines: --backend tensorrt on a GPU)")
    p.add_argument("--fresh", action="store_true", help="redo every stage")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat demo``."""
    from trtqat.demo import DemoConfig, run_demo

    fields = DemoConfig.__dataclass_fields__
    report = run_demo(DemoConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 1 if report.get("partial") else 0

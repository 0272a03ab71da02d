"""``trtqat demo``: the whole pipeline on the bundled digits data (the README's main job)."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli import validate as V
from trtqat.engines.registry import default_backend
from trtqat.stages.demo_models import DEMO_MODELS, DEMO_RUNS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat demo`` to the command line."""
    p = O.command(
        subparsers, "demo", "the whole pipeline on the bundled digits data: train, PTQ, QAT, "
        "export, engines, benchmark, report",
        f"For each model ({','.join(DEMO_MODELS)} by default; --model picks others, e.g. "
        "resnet18,mobilenet_v2): FP32 "
        "training on scikit-learn's digits (32x32), PTQ with every calibrator "
        "(max, percentile 99.9/99.99, MSE, entropy), QAT from the best of them in PyTorch, "
        "export of "
        "every ONNX variant, engines, trtexec-style benchmark; then one report of every model "
        "(report.md, report.json, report.png in --out; each model's own in --out/MODEL). "
        "Finished stages are reused unless --fresh.")
    O.add_model(p, None, "image classifier(s) of any image family, separated by commas: "
                "torchvision or timm names, path/to/file.py:factory, vit (a small Vision "
                "Transformer); or a detector: yolo_digits (digits composited onto canvases, COCO "
                f"mAP) (default: {','.join(DEMO_MODELS)})")
    O.add_data(p, "digits", "digits, synthetic or an ImageFolder path", metavar=None)
    O.add_format(p, demo=True)
    O.add_image_size(p, None, "input resolution: N (square) or HxW, at least 8 (default: "
                     "the family's, 32 for classifiers, 96 for detectors)")
    O.add_epochs(p, None, "FP32 training epochs (default: the family's recipe, 15 for CNNs, "
                 "30 for Vision Transformers)")
    p.add_argument("--calib-batches", type=V.positive_int, default=8,
                   help="batches per PTQ calibration (fewer than `trtqat calibrate "
                   "--num-batches`'s 16: the demo calibrates each model 5 times)")
    p.add_argument("--runs", default=DEMO_RUNS, type=V.writable_dir,
                   help="folder of the training run folders (one sub-folder per model)")
    O.add_export_dir(p, "where the ONNX variants go")
    O.add_out(p, "engines", "where engines and the report go", metavar=None)
    O.add_backend(p, default_backend())
    O.add_measure_args(p, 1.0, "seconds of measurement per variant and batch size")
    O.add_threads(p)
    O.add_device(p, "where training, calibration and QAT run: auto, cpu, cuda or cuda:N "
                 "(engines: --backend tensorrt on a GPU)")
    O.add_fresh(p, "redo every stage")
    O.add_no_progress(p, "no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat demo``."""
    from trtqat.stages.demo import DemoConfig, run_demo

    report = run_demo(O.config_from(DemoConfig, args))
    return 1 if report.partial else 0

"""``trtqat calibrate``: post-training quantization (PTQ) of an FP32 checkpoint or model."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli.validate import finite_float, positive_int, writable_dir
from trtqat.quant.calib.registry import methods

SUMMARY = "PTQ: quantize an FP32 checkpoint and calibrate its ranges (amax)"
DESCRIPTION = ("Load an FP32 checkpoint (or any float model: --model NAME|FILE.py:FACTORY "
               "--weights FILE), insert quantizers, collect activation "
               "histograms on --num-batches training batches (eval transforms), compute amax with "
               "--method, evaluate, and save the calibrated checkpoint (stage 'ptq').")
EPILOG = ("example:\n  trtqat calibrate --checkpoint runs/fp32/best.pt --method max "
          "--out runs/ptq\n  trtqat calibrate --model my_net.py:make --weights my_net.pt "
          "--data calib_images/ --image-size 224 --out runs/ptq\n  trtqat calibrate --model "
          "minilm --data builtin --out runs/minilm/ptq"
          "\n\nSentence encoders (--model minilm or a Hugging Face BERT-family folder, no "
          "--checkpoint): PTQ on the\ncorpus' training split, embedding fidelity (mean cosine, "
          "Spearman vs FP32) on its held-out split;\nthe FP32 reference checkpoint goes to the "
          "sibling folder fp32/ (--fp32-out).\n\n" + O.EPILOG_DIST.format(cmd="calibrate")
          + "\nStatistics are merged across processes: every rank holds the same amax.")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat calibrate`` to the command line."""
    p = O.command(subparsers, "calibrate", SUMMARY, DESCRIPTION, EPILOG)
    g = p.add_argument_group("calibration")
    O.add_checkpoint(g, help="FP32 checkpoint (a .pt from `trtqat train`, or its run folder); "
                     "required for CNNs, optional for encoders (--model)")
    g.add_argument("--method", choices=methods(), default=None,
                   help=O.method_help(
                       "how amax is computed from the activation histograms; CNNs default to "
                       "max, the best PTQ top-1 measured (benchmarks/calib_default.py: ResNet18 "
                       "and MobileNetV2 on digits, where entropy, TensorRT's legacy "
                       "calibrator, lost 10-14 points by clipping ReLU outputs)"))
    g.add_argument("--percentile", type=finite_float(gt=0, le=100, unit="percent"),
                   default=99.99, help="percentile kept by --method percentile")
    g.add_argument("--num-batches", type=positive_int, default=16,
                   help="calibration batches per process (`trtqat demo --calib-batches` "
                   "defaults to 8: it calibrates every model with 5 calibrators)")
    O.add_skip_layers(g)
    O.add_format(g)
    O.add_model(g, help=O.families_help(
        "without --checkpoint: the float model to start from; with --checkpoint: the "
        "expected architecture; of any family"))
    O.add_weights(g)
    O.add_num_classes(g, "with --model: output classes (default: the model's own)")
    g = p.add_argument_group("encoders (--model minilm|FOLDER; --data builtin|FILE.txt, "
                             "default builtin)")
    O.add_num_sentences(g, 512, "calibration sentences from the corpus' training split")
    O.add_max_length(g, 128, "tokens per sentence (truncation)")
    g.add_argument("--fp32-out", default=None, metavar="RUN_DIR", type=writable_dir,
                   help="where the FP32 reference checkpoint goes (default: OUT/../fp32)")
    O.add_data_args(p, inherit=True, calibration=True)
    O.add_run_args(p, "runs/ptq", resumable=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat calibrate``."""
    from trtqat.stages.calibrate import CalibrateConfig, calibrate

    O.print_summary(calibrate(O.config_from(CalibrateConfig, args)))
    return 0

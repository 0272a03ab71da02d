"""``trtqat export``: a checkpoint to checked ONNX variants (fp32, fp16, int8, int8-fp16,
fp8, fp8-fp16)."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli.validate import BadValue, positive_int
from trtqat.variants import CHOICES as VARIANT_CHOICES

SUMMARY = "export ONNX variants (fp32, fp16, int8/fp8 Q/DQ, int8-fp16, fp8-fp16), each checked"
DESCRIPTION = ("Export a checkpoint to ONNX. In TensorRT 11 precision comes only from the "
               "file: Q/DQ for INT8 and FP8, fp16 tensors for FP16. Every file is checked "
               "(onnx.checker, ONNX Runtime vs PyTorch, top-1 agreement on the validation "
               "split, the Q/DQ lint for int8 and fp8) before it is written; a failed check "
               "keeps no file.")


def _batch(value: str) -> int | None:
    if value == "dynamic":
        return None
    try:
        return positive_int(value)
    except BadValue:
        raise BadValue(f"expected 'dynamic' or an integer >= 1, got {value!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``export`` subcommand."""
    p = O.command(subparsers, "export", SUMMARY, DESCRIPTION)
    O.add_checkpoint(p, required=True, help="a .pt of train/calibrate/qat, or its run folder")
    p.add_argument("--variant", default="all", choices=VARIANT_CHOICES,
                   help="quantized variants (int8*, fp8*) need a calibrated (ptq) or qat "
                   "checkpoint of that format; all: the float variants and the "
                   "checkpoint's format's")
    O.add_out(p, "export", "output folder", metavar=None)
    p.add_argument("--opset", type=positive_int, default=None,
                   help="ONNX opset, >= 13 (default 17; int8-fp16 uses >= 19 for fp16 "
                   "scales; fp8 variants need >= 19, their default)")
    p.add_argument("--fp8-weights", choices=["compressed", "qdq"], default="compressed",
                   help="fp8 variants: FP8 weight initializers read by DequantizeLinear, 1 "
                   "byte per weight (compressed, default), or float weights with Q/DQ (qdq)")
    p.add_argument("--batch", type=_batch, default=None, metavar="dynamic|N",
                   help="dynamic batch dimension (default) or a fixed batch N")
    p.add_argument("--dynamic", type=O.csv, default=None, metavar="AXES",
                   help="dynamic axes of the image input, of batch,height,width (default: "
                   "batch, or none with --batch N)")
    O.add_max_length(p, None, "encoders: tokens per sentence of the traced example, still "
                     "dynamic (default: the checkpoint's max_length, 128)")
    O.add_image_size(p, None, "input height and width (default: the checkpoint's)")
    p.add_argument("--io-dtype", choices=["fp32", "fp16"], default="fp32",
                   help="input/output dtype of fp16 variants (fp32 adds casts)")
    O.add_data(p, None, "validation data: digits, synthetic, an ImageFolder, a flat image "
               "folder or a .npy/.npz (default: the checkpoint's, else digits)", metavar=None)
    p.add_argument("--val-batches", type=positive_int, default=None,
                   help="validate on at most this many batches of 64 (default: the whole split)")
    p.add_argument("--no-validate", dest="validate", action="store_false",
                   help="skip ONNX Runtime checks and the lint (onnx.checker still runs)")
    p.add_argument("--no-fold-bn", dest="fold_bn", action="store_false",
                   help="keep BatchNorm layers as they are")
    O.add_skip_layers(p, "glob patterns of layers exported in float (no Q/DQ), added to the "
                      "checkpoint's own; see `trtqat sensitivity`")
    p.add_argument("--input-names", type=O.csv, default=(), metavar="NAMES",
                   help="ONNX input names, comma-separated (default: the model's: input for "
                   "classifiers, images for detectors)")
    p.add_argument("--output-names", type=O.csv, default=(), metavar="NAMES",
                   help="ONNX output names (default: output; output0 for detectors)")
    p.add_argument("--nms", action="store_true",
                   help="detectors: also write *-nms.onnx with box decoding and ONNX "
                   "NonMaxSuppression (output 'detections': batch, x1, y1, x2, y2, score, "
                   "class per kept box)")
    O.add_threads(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export every requested variant; exit 1 if any failed its checks."""
    from trtqat.stages.export import ExportOptions, export_checkpoint

    export_checkpoint(O.config_from(ExportOptions, args))  # prints each file's checks
    return 0

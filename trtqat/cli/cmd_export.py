"""``trtqat export``: a checkpoint to checked ONNX variants (fp32, fp16, int8, int8-fp16)."""

from __future__ import annotations

from trtqat.cli.cmd_train import csv as _csv
from trtqat.cli.cmd_train import image_size_arg
from trtqat.cli.validate import BadValue, int_range, positive_int, writable_dir
from trtqat.variants import CHOICES as VARIANT_CHOICES


def _batch(value: str) -> int | None:
    if value == "dynamic":
        return None
    try:
        return positive_int(value)
    except BadValue:
        raise BadValue(f"expected 'dynamic' or an integer >= 1, got {value!r}") from None


def register(subparsers) -> None:
    """Add the ``export`` subcommand."""
    p = subparsers.add_parser(
        "export", help="export ONNX variants (fp32, fp16, int8 Q/DQ, int8-fp16), each checked",
        description="Export a checkpoint to ONNX. In TensorRT 11 precision comes only from the "
        "file: Q/DQ for INT8, fp16 tensors for FP16. Every file is checked (onnx.checker, ONNX "
        "Runtime vs PyTorch, top-1 agreement on the validation split, the Q/DQ lint for int8) "
        "before it is written; a failed check keeps no file.")
    p.add_argument("--checkpoint", required=True, help="a .pt of train/calibrate/qat, or its run folder")
    p.add_argument("--variant", default="all", choices=VARIANT_CHOICES,
                   help="int8 variants need a calibrated (ptq) or qat checkpoint (default: all)")
    p.add_argument("--out", default="export", type=writable_dir,
                   help="output folder (default: export)")
    p.add_argument("--opset", type=positive_int, default=17,
                   help="ONNX opset, >= 13 (default 17; int8-fp16 uses >= 19 for fp16 scales)")
    p.add_argument("--batch", type=_batch, default=None, metavar="dynamic|N",
                   help="dynamic batch dimension (default) or a fixed batch N")
    p.add_argument("--dynamic", type=_csv, default=None, metavar="AXES",
                   help="dynamic axes of the image input, of batch,height,width (default: "
                   "batch, or none with --batch N)")
    p.add_argument("--max-length", "--seq-len", type=int_range(2), default=None,
                   dest="max_length", help="encoders: tokens per sentence of the traced "
                   "example, still dynamic (default: the checkpoint's max_length, 128)")
    p.add_argument("--image-size", type=image_size_arg, default=None, metavar="N|HxW",
                   help="input height and width (default: the checkpoint's)")
    p.add_argument("--io-dtype", choices=["fp32", "fp16"], default="fp32",
                   help="input/output dtype of fp16 variants (default fp32, with casts)")
    p.add_argument("--data", default=None,
                   help="validation data: digits, synthetic, an ImageFolder, a flat image "
                   "folder or a .npy/.npz (default: the checkpoint's, else digits)")
    p.add_argument("--val-batches", type=positive_int, default=None,
                   help="validate on at most this many batches of 64 (default: the whole split)")
    p.add_argument("--no-validate", action="store_true",
                   help="skip ONNX Runtime checks and the lint (onnx.checker still runs)")
    p.add_argument("--no-fold-bn", action="store_true", help="keep BatchNorm layers as they are")
    p.add_argument("--skip-layers", type=_csv, default=(), metavar="A,B",
                   help="glob patterns of layers exported in float (no Q/DQ), added to the "
                   "checkpoint's own; see `trtqat sensitivity`")
    p.set_defaults(func=run)


def run(args) -> int:
    """Export every requested variant; exit 1 if any failed its checks."""
    from trtqat.train.export_run import ExportOptions, export_checkpoint

    return export_checkpoint(ExportOptions(
        checkpoint=args.checkpoint, variant=args.variant, out=args.out, opset=args.opset,
        batch=args.batch, dynamic=args.dynamic, image_size=args.image_size,
        io_dtype=args.io_dtype, val_batches=args.val_batches, fold_bn=not args.no_fold_bn,
        skip_layers=tuple(args.skip_layers or ()), max_length=args.max_length, data=args.data,
        validate=not args.no_validate))

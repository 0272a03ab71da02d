"""``trtqat export``: a checkpoint to checked ONNX variants (fp32, fp16, int8, int8-fp16)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtqat.cli.cmd_train import image_size_arg
from trtqat.cli.validate import BadValue, int_range, positive_int, writable_dir

log = logging.getLogger(__name__)

VARIANT_CHOICES = ("fp32", "fp16", "int8", "int8-fp16", "all")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


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
        "export", help="export ONNX variants (fp32, fp16, int8 Q/DQ, int8+fp16), each checked",
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
    p.add_argument("--seq-len", type=int_range(2), default=None,
                   help="encoders: sequence length of the traced example, still dynamic "
                   "(default: the checkpoint's max_length, 128)")
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


def _validation_loader(ckpt: dict, args, prep):
    """The validation split of the checkpoint's data (its images alone for unlabelled data:
    a flat folder or an array), or None if there is no data module."""
    try:
        from trtqat.train.data import make_loader
        from trtqat.train.data_sources import calibration_datasets
    except ImportError:
        log.warning("trtqat.train.data is not available: validating on random inputs only")
        return None
    saved = ckpt.get("args") or {}
    data = args.data or (saved.get("data") if isinstance(saved, dict) else None) or "digits"
    kwargs = {}
    if data == "synthetic":
        kwargs["num_classes"] = int(ckpt["model"]["num_classes"])
    images, val, _, _ = calibration_datasets(data, prep, **kwargs)
    val_loader = make_loader(images if val is None else val, batch_size=64, train=False)
    if args.val_batches is None:
        return val_loader
    from itertools import islice

    return list(islice(val_loader, args.val_batches))


def export_variants(args, out: Path, variants: list[str], path_of: Callable[[str], Path],
                    export_one: Callable[[Path, str], Any], shape: str,
                    info: dict[str, Any]) -> int:
    """Export each variant with ``export_one(path, variant)``, print its checks, write
    ``export.json`` (``info`` added to it); :class:`ExportError` if any failed its checks."""
    from trtqat.atomic import write_atomic
    from trtqat.export import ExportError, ValidationError

    failed, summary = [], []
    for variant in variants:
        path = path_of(variant)
        try:
            result = export_one(path, variant)
        except ValidationError as exc:
            result = exc.result
            failed.append(path.name)
        print(f"{path.name}  ({variant}, opset {result.opset}, {shape})")
        for line in result.lines():
            print(f"  {line}")
        print(f"  -> {'not written' if path.name in failed else path}")
        summary.append(result.to_dict() | {"written": path.name not in failed})
    payload = {"checkpoint": str(args.checkpoint), "variant": args.variant,
               "opset": args.opset, **info, "results": summary}
    write_atomic(out / "export.json", lambda f: f.write(json.dumps(payload, indent=2).encode()))
    if failed:
        raise ExportError(f"{len(failed)} of {len(variants)} variant(s) failed their checks "
                          f"and were not written: {', '.join(failed)}")
    return 0


def run(args) -> int:
    """Export every requested variant; exit 1 if any failed its checks."""
    from trtqat.export import Exporter, ExportError, artifact_name
    from trtqat.export.naming import INT8_VARIANTS, expand_variants
    from trtqat.export.onnx_export import check_writable, make_example_inputs
    from trtqat.finite import check_finite_arrays
    from trtqat.train.checkpoint import build_from_checkpoint, load_checkpoint
    from trtqat.train.data_sources import make_preprocess

    variants = expand_variants(args.variant)
    ckpt = load_checkpoint(args.checkpoint)
    check_finite_arrays(ckpt["state_dict"].items(), f"checkpoint {args.checkpoint}",
                        "nothing exported; retrain it with a lower --lr")
    if ckpt.get("model", {}).get("family") == "transformer":  # a sentence encoder
        from trtqat.cli.export_encoder import run_encoder

        return run_encoder(args, ckpt)
    spec, stage = ckpt["model"], str(ckpt.get("stage", "fp32"))
    if any(v in INT8_VARIANTS for v in variants) and not spec.get("quantized"):
        raise ExportError(
            f"{args.checkpoint} is a {stage} checkpoint without quantizer state, so it has no "
            "INT8 form: run `trtqat calibrate` (PTQ) or `trtqat qat` first, or export "
            "--variant fp32/fp16")
    out = check_writable(args.out)
    model = build_from_checkpoint(ckpt)
    if any(v in INT8_VARIANTS for v in variants):
        from trtqat.export.calibrated import refuse_uncalibrated

        refuse_uncalibrated(model)  # before any file is written
    skip = tuple(getattr(args, "skip_layers", ()) or ())
    if skip:
        from trtqat.quant.model_ops import disable_layers

        disable_layers(model, skip)  # an unknown pattern is a clear error
    # recorded in the int8 files' metadata, so `trtqat lint` knows these are float on purpose
    model.trtqat_skip_layers = tuple(dict.fromkeys([*(spec.get("skip_layers") or []), *skip]))
    prep = make_preprocess(args.image_size, recorded=spec.get("preprocess"),
                           default_size=spec.get("image_size") or 32)
    axes = _dynamic_axes(args)
    batch = args.batch or (None if "batch" in axes else 1)
    inputs = make_example_inputs(prep.size, batch or 2, prep.channels)
    val = None if args.no_validate else _validation_loader(ckpt, args, prep)
    exporter = Exporter(model, inputs, fold_bn=not args.no_fold_bn, validation_data=val,
                        dynamic_axes=axes)
    shape = (f"dynamic {', '.join(axes)}" if axes else "static") + (
        f", batch {batch}" if batch else "")
    return export_variants(
        args, out, variants, lambda v: out / artifact_name(spec["arch"], stage, v, args.batch),
        lambda path, v: exporter.export(path, v, args.opset, io_dtype=args.io_dtype,
                                        validate=not args.no_validate),
        "dynamic batch" if axes == ("batch",) else shape,
        {"batch": batch or "dynamic", "dynamic": list(axes),
         "input_shape": [batch or "N", prep.channels,
                         *[a if a in axes else n for a, n in zip(("height", "width"), prep.size)]]})


def _dynamic_axes(args) -> tuple[str, ...]:
    """``--dynamic`` checked against ``--batch``: batch alone by default."""
    from trtqat.export import ExportError

    if args.dynamic is None:
        return ("batch",) if args.batch is None else ()
    if args.batch is not None and "batch" in args.dynamic:
        raise ExportError(f"--batch {args.batch} fixes the batch, but --dynamic "
                          f"{','.join(args.dynamic)} makes it dynamic: drop one of them")
    return tuple(args.dynamic)

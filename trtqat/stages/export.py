"""``export_checkpoint``: a checkpoint of any family to checked ONNX variants.

The family (:func:`trtqat.families.of_checkpoint`) loads the model and builds its
:class:`~trtqat.export.onnx_export.ExportPlan` (``family.export_plan``); one
:class:`~trtqat.export.onnx_export.Exporter` writes every variant under the one naming rule
(:func:`trtqat.variants.artifact_name`), then ``export.json`` sums it up. The image
classifiers' plan (CNN, and families derived from it) is :func:`image_export` here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtqat.families.types import FamilyExport

if TYPE_CHECKING:
    from trtqat.export.result import ExportResult

log = logging.getLogger(__name__)


@dataclass
class ExportOptions:
    """Options of ``trtqat export`` (family-specific ones are refused by the others)."""

    checkpoint: str = ""
    variant: str = "all"
    out: str = "export"
    opset: int | None = None          # None: 17, raised to what a variant needs
    batch: int | None = None            # images: a fixed batch (None: dynamic)
    dynamic: tuple[str, ...] | None = None  # images: of batch, height, width
    image_size: Any = None              # images
    io_dtype: str = "fp32"              # images: input/output dtype of fp16 variants
    val_batches: int | None = None      # images
    fold_bn: bool = True                # images
    skip_layers: tuple[str, ...] = ()   # images
    max_length: int | None = None       # encoders: tokens of the traced example
    data: str | None = None             # validation data (default: the checkpoint's)
    validate: bool = True
    input_names: tuple[str, ...] = ()   # ONNX names (default: the family's or the model's)
    output_names: tuple[str, ...] = ()
    nms: bool = False                   # detectors: also write a file with box decoding + NMS
    fp8_weights: str = "compressed"     # fp8 variants: FP8 weight initializers, or qdq (float)
    threads: int | None = None          # CPU threads (trtqat.threads; None: the defaults)


@dataclass
class ExportRun:
    """What :func:`export_checkpoint` wrote: one checked file per variant, and
    ``export.json`` (``summary_file``) summing them up."""

    out: Path
    family: str
    results: list[ExportResult] = field(default_factory=list)  # one per variant, in order
    summary_file: Path | None = None

    @property
    def files(self) -> list[Path]:
        """The ONNX files written."""
        return [r.path for r in self.results]


def export_checkpoint(options: ExportOptions, echo: Callable[[str], None] = print
                      ) -> ExportRun:
    """Export every requested variant of ``options.checkpoint``; print each file's checks;
    write ``export.json``. :class:`ExportError` if any variant failed its checks (after
    export.json records which); otherwise the :class:`ExportRun`."""
    from trtqat import families
    from trtqat.export import ExportError
    from trtqat.export.calibrated import refuse_uncalibrated
    from trtqat.export.onnx_export import Exporter
    from trtqat.export.result import check_writable
    from trtqat.export.variant_args import check_args
    from trtqat.finite import check_finite_arrays
    from trtqat.threads import apply_threads

    apply_threads(options.threads)
    from trtqat.formats import of_checkpoint
    from trtqat.runs.checkpoint import load_checkpoint
    from trtqat.variants import artifact_name, expand_variants, stage_tag, variants_for
    from trtqat.variants import variant as variant_row

    ckpt = load_checkpoint(options.checkpoint)
    spec, stage = ckpt["model"], str(ckpt.get("stage", "fp32"))
    fmt = of_checkpoint(ckpt)
    variants = expand_variants(options.variant, fmt)
    asked = [variant_row(v).format for v in variants if variant_row(v).quantized]
    if asked and not spec.get("quantized"):
        with_format = f" with --format {asked[0]}" if asked[0] != "int8" else ""
        raise ExportError(
            f"{options.checkpoint} is a {stage} checkpoint without quantizer state, so it has "
            f"no {asked[0].upper()} form: run `trtqat calibrate` (PTQ) or `trtqat qat` first"
            f"{with_format}, or export --variant fp32/fp16")
    other = [v for v in variants if variant_row(v).format not in (None, fmt)]
    if other:
        raise ExportError(f"{options.checkpoint} is quantized in {fmt.upper()}, so it has no "
                          f"{other[0]} variant: use --variant {', '.join(variants_for(fmt))} "
                          "or all")
    for name in variants:  # an opset too low for one of them: before any file or folder
        check_args(name, options.opset)
    check_finite_arrays(ckpt["state_dict"].items(), f"checkpoint {options.checkpoint}",
                        "nothing exported; retrain it with a lower --lr")
    family = families.of_checkpoint(ckpt)
    int8 = bool(asked)
    model = family.load(ckpt)
    if int8:
        refuse_uncalibrated(model)  # before any file is written
    job = family.export_plan(model, ckpt, options)
    if options.nms and job.post is None:
        raise ExportError(f"--nms adds box decoding and NMS to detectors; {options.checkpoint} "
                          f"holds a {family.name} model: drop --nms")
    exporter = Exporter(model, family.stamp_plan(job.plan))
    tag = stage_tag(ckpt)
    out = Path(options.out)
    paths = {v: out / artifact_name(job.arch, tag, v, job.batch) for v in variants}
    refuse_foreign_exports(out, paths.values(), options.checkpoint)
    check_writable(out)  # the folder appears only now that everything is checked
    run = ExportRun(out, family.checkpoint_tag or family.name)
    failed, summary = [], []
    for variant, path in paths.items():
        result, ok = _export_one(exporter, path, variant, options, job)
        if ok:
            run.results.append(result)
        else:
            failed.append(path.name)
        echo(f"{path.name}  ({variant}, opset {result.opset}, {job.shape})")
        for line in result.lines():
            echo(f"  {line}")
        echo(f"  -> {path if ok else 'not written'}")
        if ok and job.post is not None:
            for line in job.post(path, result):
                echo(line)
        summary.append(result.to_dict() | {"written": ok})
    run.summary_file = _write_summary(out, options, {"family": run.family, **job.info},
                                      summary)
    if failed:
        raise ExportError(f"{len(failed)} of {len(variants)} variant(s) failed their checks "
                          f"and were not written: {', '.join(failed)}")
    return run


def refuse_foreign_exports(out: Path, paths: Any, checkpoint: str) -> None:
    """Before anything is written: every name (read from the checkpoint) stays in ``out``,
    and the files to replace are earlier exports (ONNX models, an export summary)."""
    from trtqat.atomic import json_with_keys, refuse_foreign
    from trtqat.export import ExportError
    from trtqat.export.result import is_trtqat_onnx

    for path in paths:
        if path.parent != out or path.name in ("", ".", ".."):
            raise ExportError(f"{checkpoint} names an output outside --out ({path}); nothing "
                              "exported")
        refuse_foreign(path, is_trtqat_onnx, "an ONNX model trtqat exported (an earlier "
                       "export)", "--out")
    refuse_foreign(out / "export.json", json_with_keys("checkpoint", "variant", "results"),
                   "an earlier export summary (export.json)", "--out")


def _export_one(exporter, path: Path, variant: str, options: ExportOptions, job: FamilyExport):
    from trtqat.export import ValidationError

    try:
        return exporter.export(path, variant, options.opset, io_dtype=job.io_dtype,
                               validate=options.validate, metadata=job.metadata,
                               fp8_weights=options.fp8_weights), True
    except ValidationError as exc:
        return exc.result, False


def _write_summary(out: Path, options: ExportOptions, info: dict[str, Any],
                   results: list[dict[str, Any]]) -> Path:
    from trtqat.atomic import write_json

    checkpoint = str(options.checkpoint)
    results = [r | {"checkpoint": checkpoint} for r in results]
    payload = {"checkpoint": checkpoint, "variant": options.variant,
               "opset": options.opset, **info,
               "results": _earlier_results(out / "export.json", results) + results}
    return write_json(out / "export.json", payload)


def _earlier_results(path: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results an earlier export.json in the same folder holds for other files that are
    still there (every export of a folder lies in it): one export of each variant after another keeps every variant's record.
    (``refuse_foreign_exports`` has already checked the file is an export summary.)"""
    import json

    try:
        earlier = json.loads(path.read_bytes()).get("results", [])
    except (OSError, ValueError, AttributeError):
        return []
    replaced = {Path(r["path"]).name for r in new}
    return [r for r in earlier if isinstance(r, dict) and isinstance(r.get("path"), str)
            and Path(r["path"]).name not in replaced
            and (path.parent / Path(r["path"]).name).is_file()]

"""The export of a detector: the detection family's half of ``trtqat export``, and its check.

Files hold the raw head output ``(batch, 4 + classes, anchors)`` under the model's names
(``images``/``output0`` unless ``--input-names``/``--output-names``); ``--nms`` adds a
``*-nms.onnx`` beside each with box decoding and ONNX ``NonMaxSuppression`` (:mod:`.nms`).

The check compares each part of the output on its own scale: the boxes in pixels and the
class scores in [0, 1] (one step size for both would let a box move by many pixels as
"rounding"), and the detections both sides keep at score >= 0.25.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from trtqat.export import criterion as crit
from trtqat.export import validate as val
from trtqat.families.detect.heads import Head, detections
from trtqat.families.detect.masks import mask_pairs
from trtqat.families.types import FamilyExport
from trtqat.quant.plugins.ultralytics import head_task
from trtqat.variants import variant as variant_row

if TYPE_CHECKING:
    from trtqat.stages.export import ExportOptions

MATCH_SCORE = 0.25   # detections compared: those a deployment keeps
MATCH_IOU = 0.9      # the same detection: same class, this IoU
MIN_MATCHED = {"fp32": 0.99, "fp16": 0.97}  # share of the reference's detections; int8: 0.95
MIN_MATCHED_INT8 = 0.95


def detector_export(family: Any, model: nn.Module, ckpt: dict[str, Any],
                    options: ExportOptions) -> FamilyExport:
    """Example images of the checkpoint's size, validation images of its data, the
    family's float layers (and ``--skip-layers``) marked as float on purpose."""
    from trtqat.families.cnn.export import dynamic_axes, family_plan
    from trtqat.families.detect.sources import float_layers
    from trtqat.families.detect.ultralytics import anchors_follow_input
    from trtqat.quant.model_ops import disable_layers

    spec = ckpt["model"]
    anchors_follow_input(model)
    if options.skip_layers:
        disable_layers(model, tuple(options.skip_layers))
    model.trtqat_skip_layers = tuple(dict.fromkeys(
        [*float_layers(model), *(spec.get("skip_layers") or []), *options.skip_layers]))
    size = options.image_size or spec.get("image_size") or 96
    axes = dynamic_axes(options)
    batch = options.batch or (None if "batch" in axes else 1)
    inputs = family.export_inputs(model, {**spec, "image_size": size}, batch)
    val_data = _validation(ckpt, options, size) if options.validate else None
    plan, shape = family_plan(family, inputs, options, val_data, axes, batch)
    post = None
    task = head_task(model)
    if options.nms and task not in (None, "detect"):
        from trtqat.export import ExportError

        raise ExportError(f"--nms decodes a detection head's boxes and class scores, but this "
                          f"is an Ultralytics {task} model (its output0 holds more): export "
                          "it without --nms")
    if options.nms:
        from trtqat.families.detect.nms import nms_companion

        def post(path, result):
            return nms_companion(path, plan, val_data or [inputs.example[0]])

    plan = head_plan(plan, model)
    h, w = (size, size) if isinstance(size, int) else size
    return FamilyExport(plan, str(spec["arch"]), shape, batch=options.batch,
                        io_dtype=options.io_dtype,
                        info={"batch": batch or "dynamic", "dynamic": list(axes),
                              "input_shape": [batch or "N", 3, h, w],
                              "input_names": plan.input_names,
                              "output_names": plan.output_names}, post=post)


def head_plan(plan: Any, model: nn.Module) -> Any:
    """``plan`` checked as what ``model``'s head outputs (:func:`detection_checks` of its
    :class:`~.heads.Head`; an Ultralytics classifier's top-1 agreement), the head's task
    in the file's metadata (``trtqat.head``, ``trtqat.classes``, ``trtqat.keypoints``:
    :meth:`~.heads.Head.metadata`) for an Ultralytics model."""
    from functools import partial

    from trtqat.export.checks import classifier_checks
    from trtqat.families.detect.heads import head_of

    head = head_of(model)
    plan.checks = (classifier_checks if head.task == "classify"
                   else partial(detection_checks, head=head))
    if head_task(model) is not None:  # the engine builders' check reads it
        plan.metadata = {**plan.metadata, **head.metadata()}
    return plan


def _validation(ckpt: dict[str, Any], options: ExportOptions, size: Any) -> list:
    """Validation images of the checkpoint's data (``--val-batches`` of 32 at most)."""
    from trtqat.families.detect.data import datasets, loader

    args = ckpt.get("args") or {}
    _, val_ds, _ = datasets(options.data or args.get("data") or "digits", size)
    batches = loader(val_ds, 32, False)
    return [x for x, _ in islice(batches, options.val_batches or 4)]


def _rounding(context: Any) -> list[list[tuple[np.ndarray, np.ndarray]]] | None:
    """Per batch and output, ``(float64, float32)`` outputs of the exported reference: the
    rounding noise of a Q/DQ model is their difference (None when it cannot run in
    float64)."""
    import torch

    from trtqat.outputs import flatten

    model64 = crit.float64_reference(context.traced) if context.traced is not None else None
    if model64 is None or not context.batches:
        return None
    pairs = []
    with torch.no_grad():
        for inputs in context.batches:
            out64 = [t for _, t in flatten(model64(*(t.double() for t in inputs)))]
            out32 = [t for _, t in flatten(context.traced(*(t.float() for t in inputs)))]
            pairs.append([(a.numpy(), b.double().numpy()) for a, b in zip(out64, out32)])
    return pairs


def _floor(diffs: list[np.ndarray] | None, part: Any) -> float | None:
    if not diffs:
        return None
    d = np.concatenate([x[:, part].reshape(-1) for x in diffs])
    d = d[np.isfinite(d)]
    return float(d.mean()) if d.size else None


def _slice_check(variant: str, name: str, label: str, unit: str, got: np.ndarray,
                 ref: np.ndarray, floor: float | None) -> val.Check:
    d = np.abs(got.astype(np.float64) - ref)
    if not (np.isfinite(got).all() and np.isfinite(ref).all()):
        return val.Check(f"output '{name}' {label} finite", False, "NaN/inf values")
    scale = max(float(np.abs(ref).max(initial=0.0)), np.finfo(np.float32).tiny)
    title = f"output '{name}' {label} vs PyTorch"
    if variant in val.REL_TOL:
        rel, tol = float(d.max(initial=0.0)) / scale, val.REL_TOL[variant]
        return val.Check(title, rel <= tol, f"max rel diff {rel:.2e} (<= {tol:.0e}), max abs "
                         f"diff {d.max(initial=0.0):.3g}{unit}")
    step = scale / 127.0
    nf = None if floor is None else crit.NoiseFloor(floor, 0, 0)
    limit = crit.mean_limit(variant, nf, step)
    mean = float(d.mean()) if d.size else 0.0
    return val.Check(f"{title} fake-quant", mean <= limit,
                     f"mean diff {mean:.3g}{unit} = {mean / step:.3f} step (<= "
                     f"{limit / step:.2f}; noise floor "
                     f"{'not measured' if floor is None else format(floor / step, '.3f')} "
                     f"step), max {d.max(initial=0.0):.3g}{unit}; step = {step:.3g}{unit}")


def matched_share(got: np.ndarray, ref: np.ndarray) -> tuple[int, int]:
    """``(matched, total)``: the reference's detections (score >= 0.25) that the candidate
    has too (same class, IoU >= 0.9)."""
    import torch

    from trtqat.families.detect.loss import pairwise_iou
    from trtqat.families.detect.metrics import postprocess

    matched = total = 0
    for g, r in zip(postprocess(got, conf=MATCH_SCORE), postprocess(ref, conf=MATCH_SCORE)):
        total += len(r)
        if not len(r) or not len(g):
            continue
        iou = pairwise_iou(torch.from_numpy(r[:, :4]), torch.from_numpy(g[:, :4])).numpy()
        same = (r[:, None, 5] == g[None, :, 5]) & (iou >= MATCH_IOU)
        matched += int(same.any(1).sum())
    return matched, total


def detection_checks(variant: str, reference: Sequence[Sequence[np.ndarray]],
                     candidate: Sequence[Sequence[np.ndarray]], context: Any,
                     head: Head | None = None) -> list[val.Check]:
    """Per part of the head's outputs (boxes, scores, a task head's mask coefficients,
    keypoints or angles; a segment head's protos and the masks they make): float variants
    within the variants table's relative tolerance, INT8 within the noise-floor criterion
    of its own step; the kept detections matched; the Q/DQ inventory of INT8 files."""
    head = head or Head()
    int8 = variant_row(variant).qdq  # INT8 or FP8 Q/DQ
    for i, name in enumerate(context.names):
        if any(c[i].shape != r[i].shape for c, r in zip(candidate, reference)):
            return [val.Check(f"output '{name}'", False, "shape differs between ONNX Runtime "
                              "and PyTorch")]
    noise = _rounding(context) if int8 else None
    checks: list[val.Check] = []
    for i, name in enumerate(context.names):
        refs = [r[i] for r in reference]
        gots = [c[i] for c in candidate]
        diffs = None if noise is None else [abs(a - b) for a, b in (n[i] for n in noise)]
        for label, part, unit in _parts(head, i, refs[0]):
            ref = np.concatenate([r[:, part].reshape(-1) for r in refs])
            got = np.concatenate([g[:, part].reshape(-1) for g in gots])
            checks.append(_slice_check(variant, name, label, unit, got, ref,
                                       _floor(diffs, part)))
        if refs[0].ndim == 3 and refs[0].shape[1] > 4:
            checks.append(_matched_check(variant, name, head, gots, refs, int8))
    if head.task == "segment" and len(context.names) > 1:
        got, ref, floor = mask_pairs(reference, candidate, head, noise)
        checks.append(_slice_check(variant, context.names[1], "masks", "", got, ref, floor))
    if int8 and context.traced is not None and context.onnx_path:
        import onnx

        from trtqat.export.qdq_check import check_qdq_inventory

        checks.append(check_qdq_inventory(onnx.load(context.onnx_path), context.traced,
                                          fp16=variant_row(variant).fp16))
    return checks


def _parts(head: Head, index: int, ref: np.ndarray) -> list:
    """The parts of a ``(B, C, A)`` output (the head's), else the whole (a segment head's
    protos, output ``index`` 1)."""
    if ref.ndim == 3 and ref.shape[1] > 4:
        return head.parts(int(ref.shape[1]))
    return [("protos" if head.task == "segment" and index == 1 else "all", slice(None), "")]


def _matched_check(variant: str, name: str, head: Head, gots: list, refs: list,
                   int8: bool) -> val.Check:
    """The reference's kept detections (boxes and class scores alone) the candidate has."""
    pairs = [(detections(g, head), detections(r, head)) for g, r in zip(gots, refs)]
    matched, total = map(sum, zip(*(matched_share(g, r) for g, r in pairs)))
    need = MIN_MATCHED_INT8 if int8 else MIN_MATCHED.get(variant, 0.97)
    ok = total == 0 or matched >= need * total
    return val.Check(f"detections '{name}'", ok,
                     f"{matched} of {total} kept detections (score >= {MATCH_SCORE}) match "
                     f"PyTorch's (same class, IoU >= {MATCH_IOU}; >= {need:.0%} needed)")

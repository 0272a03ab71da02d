"""How far a re-encoded detector moved: the agreement check of detection outputs.

A detector's head output ``(batch, 4 + classes, anchors)`` (box centre x, y, width, height,
then class scores; files whose metadata ``trtqat.task`` is ``detection``) has no top-1: the
share that agrees is that of the confident anchors of the reference (best class score >=
:data:`CONFIDENT`) where the candidate keeps the same class at a score >= :data:`KEPT` and a
box overlapping the reference's by IoU >= :data:`MIN_IOU`. numpy only (no torch).
"""

from __future__ import annotations

import numpy as np

TASK = "detection"
CONFIDENT = 0.5
KEPT = 0.25
MIN_IOU = 0.8


def is_detection(model) -> bool:
    """True when an ONNX model's metadata says it is a detector (``trtqat.task``)."""
    return any(p.key == "trtqat.task" and p.value == TASK for p in model.metadata_props)


def _xyxy(b: np.ndarray) -> np.ndarray:
    half = b[2:4] / 2
    return np.concatenate([b[:2] - half, b[:2] + half])


def agreement(ref: np.ndarray, cand: np.ndarray) -> tuple[int, int]:
    """``(agreeing, confident)`` anchors of one output pair ``(B, 4 + C, A)``."""
    ref, cand = ref.astype(np.float64), cand.astype(np.float64)
    r_cls, c_cls = ref[:, 4:].argmax(1), cand[:, 4:].argmax(1)  # (B, A)
    r_score = ref[:, 4:].max(1)
    c_score = np.take_along_axis(cand[:, 4:], r_cls[:, None], 1)[:, 0]
    a, b = _xyxy(ref[:, :4].transpose(1, 0, 2)), _xyxy(cand[:, :4].transpose(1, 0, 2))
    w = np.clip(np.minimum(a[2], b[2]) - np.maximum(a[0], b[0]), 0, None)
    h = np.clip(np.minimum(a[3], b[3]) - np.maximum(a[1], b[1]), 0, None)
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    iou = inter / np.maximum(union, 1e-9)
    confident = r_score >= CONFIDENT
    agree = confident & (c_cls == r_cls) & (c_score >= KEPT) & (iou >= MIN_IOU)
    return int(agree.sum()), int(confident.sum())

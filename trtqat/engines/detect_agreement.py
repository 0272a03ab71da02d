"""How far a re-encoded detector moved: the agreement check of detection outputs.

A detector's head output ``(batch, 4 + classes [+ extras], anchors)`` (box centre x, y,
width, height, class scores, then a task head's own channels; files whose metadata
``trtqat.task`` is ``detection``) has no top-1: the share that agrees is that of the
confident anchors of the reference (best class score >= :data:`CONFIDENT`) where the
candidate keeps the same class at a score >= :data:`KEPT` and a box overlapping the
reference's by IoU >= :data:`MIN_IOU`, and, for a task head, the same extras:

* ``pose``: keypoints (x, y) within :data:`KEYPOINT_TOL` of the box size (mean distance of
  the keypoints the reference sees, visibility >= 0.5, over sqrt(box area));
* ``segment``: mask coefficients within :data:`COEF_TOL` (relative L2 distance);
* ``obb``: angles within :data:`ANGLE_TOL` radians (modulo pi).

The head's layout comes from the file's metadata (:func:`layout_of`): ``trtqat.head``
(detect, segment, pose, obb), ``trtqat.classes`` and ``trtqat.keypoints`` (``K,D``). Only
the class channels are read as class scores. numpy only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASK = "detection"
HEAD_KEY, CLASSES_KEY, KEYPOINTS_KEY = "trtqat.head", "trtqat.classes", "trtqat.keypoints"
CONFIDENT = 0.5
KEPT = 0.25
MIN_IOU = 0.8
KEYPOINT_TOL = 0.1   # mean keypoint distance / sqrt(box area)
COEF_TOL = 0.25      # |coef - ref| / |ref| of a mask's coefficients
ANGLE_TOL = 0.1      # radians (about 6 degrees)
VISIBLE = 0.5
# a task head's channels after the classes in Ultralytics' defaults: for files that record
# the head but not its class count
DEFAULT_EXTRAS = {"segment": 32, "pose": 51, "obb": 1}


@dataclass(frozen=True)
class Layout:
    """What the channels of a detection output mean: ``head`` (detect, segment, pose,
    obb), ``classes`` (None: every channel after the boxes) and a pose head's
    ``keypoints`` (K, D)."""

    head: str = "detect"
    classes: int | None = None
    keypoints: tuple[int, int] = (0, 0)

    def score_stop(self, channels: int) -> int:
        """The channel after the last class score."""
        if self.classes is not None:
            return min(4 + self.classes, channels)
        extras = DEFAULT_EXTRAS.get(self.head, 0)
        return channels - extras if channels - extras > 4 else channels


def is_detection(model) -> bool:
    """True when an ONNX model's metadata says it is a detector (``trtqat.task``)."""
    return any(p.key == "trtqat.task" and p.value == TASK for p in model.metadata_props)


def layout_of(model) -> Layout:
    """The :class:`Layout` an ONNX model's metadata records (a plain ``detect`` layout
    whose channels after the boxes are all class scores where it records none)."""
    meta = {p.key: p.value for p in model.metadata_props}
    head = meta.get(HEAD_KEY) or "detect"
    try:
        classes = int(meta[CLASSES_KEY]) if meta.get(CLASSES_KEY) else None
    except ValueError:
        classes = None
    try:
        k, d = (int(v) for v in str(meta.get(KEYPOINTS_KEY, "")).split(","))
    except ValueError:
        k, d = (17, 3) if head == "pose" else (0, 0)
    return Layout(head, classes, (k, d))


def _xyxy(b: np.ndarray) -> np.ndarray:
    half = b[2:4] / 2
    return np.concatenate([b[:2] - half, b[:2] + half])


def _keypoints_close(ref: np.ndarray, cand: np.ndarray, stop: int, layout: Layout
                     ) -> np.ndarray:
    """(B, A): the keypoints of each anchor within :data:`KEYPOINT_TOL` of its box size."""
    dims = layout.keypoints[1] or 2
    r, c = ref[:, stop:], cand[:, stop:]
    count = r.shape[1] // dims
    if not count:
        return np.ones(ref.shape[::2], bool)
    r = r[:, :count * dims].reshape(r.shape[0], count, dims, -1)
    c = c[:, :count * dims].reshape(c.shape[0], count, dims, -1)
    dist = np.sqrt(((r[:, :, :2] - c[:, :, :2]) ** 2).sum(2))  # (B, K, A)
    seen = r[:, :, 2] >= VISIBLE if dims == 3 else np.ones(dist.shape, bool)
    seen = np.where(seen.any(1, keepdims=True), seen, True)  # none seen: every keypoint
    mean = (dist * seen).sum(1) / seen.sum(1)
    size = np.sqrt(np.clip(ref[:, 2] * ref[:, 3], 1e-9, None))
    return mean <= KEYPOINT_TOL * size


def _extras_agree(ref: np.ndarray, cand: np.ndarray, stop: int, layout: Layout) -> np.ndarray:
    """(B, A): the task head's own channels of each anchor agree (True: none to compare)."""
    if stop >= ref.shape[1] or layout.head == "detect":
        return np.ones(ref.shape[::2], bool)
    if layout.head == "pose":
        return _keypoints_close(ref, cand, stop, layout)
    if layout.head == "obb":
        d = np.abs(cand[:, stop] - ref[:, stop]) % np.pi
        return np.minimum(d, np.pi - d) <= ANGLE_TOL
    if layout.head == "segment":
        r, c = ref[:, stop:], cand[:, stop:]
        norm = np.sqrt((r ** 2).sum(1))
        return np.sqrt(((c - r) ** 2).sum(1)) <= COEF_TOL * np.maximum(norm, 1e-6)
    return np.ones(ref.shape[::2], bool)


def agreement(ref: np.ndarray, cand: np.ndarray, layout: Layout | None = None
              ) -> tuple[int, int]:
    """``(agreeing, confident)`` anchors of one output pair ``(B, C, A)`` (see the module
    doc; ``layout`` None: every channel after the boxes is a class score)."""
    layout = layout or Layout()
    ref, cand = ref.astype(np.float64), cand.astype(np.float64)
    stop = layout.score_stop(ref.shape[1])
    r_scores, c_scores = ref[:, 4:stop], cand[:, 4:stop]
    r_cls, c_cls = r_scores.argmax(1), c_scores.argmax(1)  # (B, A)
    r_score = r_scores.max(1)
    c_score = np.take_along_axis(c_scores, r_cls[:, None], 1)[:, 0]
    a, b = _xyxy(ref[:, :4].transpose(1, 0, 2)), _xyxy(cand[:, :4].transpose(1, 0, 2))
    w = np.clip(np.minimum(a[2], b[2]) - np.maximum(a[0], b[0]), 0, None)
    h = np.clip(np.minimum(a[3], b[3]) - np.maximum(a[1], b[1]), 0, None)
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    iou = inter / np.maximum(union, 1e-9)
    confident = r_score >= CONFIDENT
    agree = confident & (c_cls == r_cls) & (c_score >= KEPT) & (iou >= MIN_IOU)
    agree &= _extras_agree(ref, cand, stop, layout)
    return int(agree.sum()), int(confident.sum())

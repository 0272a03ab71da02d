"""Detections from the head's outputs (confidence filter + per-class NMS) and COCO mAP.

The mAP is pycocotools' COCOeval (the reference implementation of the COCO metric):
``map`` is mAP@[.5:.95] and ``map50`` mAP@.5, both in percent.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

CONF = 0.001  # the COCO evaluation convention: keep low scores, the PR curve needs them
IOU = 0.6
MAX_DET = 100


def _xywh_to_xyxy(b: torch.Tensor) -> torch.Tensor:
    half = b[..., 2:4] / 2
    return torch.cat((b[..., :2] - half, b[..., :2] + half), -1)


@torch.no_grad()
def postprocess(outputs: Any, conf: float = CONF, iou: float = IOU, max_det: int = MAX_DET
                ) -> list[np.ndarray]:
    """Per image an ``(n, 6)`` array: x1, y1, x2, y2, score, class, from ``(B, 4 + C, A)``
    outputs (boxes cx, cy, w, h in pixels, class scores in [0, 1])."""
    from torchvision.ops import batched_nms

    out = torch.as_tensor(np.asarray(outputs, dtype=np.float32)) if not isinstance(
        outputs, torch.Tensor) else outputs.detach().float().cpu()
    if out.ndim != 3 or out.shape[1] < 5:
        from trtqat.families.detect.data import DetectionDataError

        raise DetectionDataError(f"a detector's output is (batch, 4 + classes, anchors), got "
                                 f"{tuple(out.shape)}")
    result = []
    for pred in out.transpose(1, 2):  # (A, 4 + C)
        boxes, scores = _xywh_to_xyxy(pred[:, :4]), pred[:, 4:]
        idx, cls = (scores > conf).nonzero(as_tuple=True)
        s = scores[idx, cls]
        if s.numel() > 30 * max_det:
            top = s.topk(30 * max_det).indices
            idx, cls, s = idx[top], cls[top], s[top]
        b = boxes[idx]
        keep = batched_nms(b, s, cls, iou)[:max_det]
        result.append(torch.cat((b[keep], s[keep, None], cls[keep, None].float()), 1).numpy())
    return result


def coco_map(detections: Sequence[np.ndarray], targets: Sequence[np.ndarray]
             ) -> dict[str, float]:
    """``{"map", "map50"}`` (percent) of ``detections`` (per image ``(n, 6)``) against
    ``targets`` (per image ``(m, 5)``: class, x1, y1, x2, y2); ``images`` and ``boxes``
    count the ground truth."""
    from trtqat.optional import require

    require("pycocotools", "detect", "the COCO mAP of detectors")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    classes = sorted({int(c) for t in targets for c in np.asarray(t)[:, 0]} |
                     {int(c) for d in detections for c in np.asarray(d)[:, 5]})
    gt: dict[str, Any] = {"images": [], "annotations": [],
                          "categories": [{"id": c + 1} for c in classes]}
    boxes = 0
    for i, t in enumerate(targets):
        gt["images"].append({"id": i + 1})
        for c, x1, y1, x2, y2 in np.asarray(t, dtype=np.float64).reshape(-1, 5):
            boxes += 1
            gt["annotations"].append({"id": boxes, "image_id": i + 1, "category_id": int(c) + 1,
                                      "bbox": [x1, y1, x2 - x1, y2 - y1],
                                      "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
    dets = [{"image_id": i + 1, "category_id": int(c) + 1, "score": float(s),
             "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]}
            for i, d in enumerate(detections)
            for x1, y1, x2, y2, s, c in np.asarray(d, dtype=np.float64).reshape(-1, 6)]
    info = {"images": float(len(targets)), "boxes": float(boxes)}
    if not boxes or not dets:
        return {"map": 0.0, "map50": 0.0, **info}
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = gt
        coco.createIndex()
        ev = COCOeval(coco, coco.loadRes(dets), "bbox")
        ev.params.maxDets = [1, 10, MAX_DET]
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {"map": 100.0 * max(float(ev.stats[0]), 0.0),
            "map50": 100.0 * max(float(ev.stats[1]), 0.0), **info}


def detection_metric(outputs: Any, targets: Sequence[np.ndarray]) -> dict[str, float]:
    """COCO mAP of raw ``(B, 4 + C, A)`` outputs against per-image targets."""
    return coco_map(postprocess(outputs), list(targets))

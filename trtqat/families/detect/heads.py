"""What each Ultralytics task head outputs, as Ultralytics' own ONNX export writes it.

In export mode (``head.export = True``, what Ultralytics' exporter sets) a head returns:

* ``detect``: ``output0`` ``(B, 4 + nc, A)``: box cx, cy, w, h in pixels, class scores;
* ``segment``: ``output0`` ``(B, 4 + nc + nm, A)`` (then the mask coefficients) and
  ``output1`` ``(B, nm, H/4, W/4)``, the protos (a mask is sigmoid(coefficients x protos));
* ``pose``: ``output0`` ``(B, 4 + nc + K*D, A)``: then per keypoint x, y in pixels (and a
  visibility in [0, 1] when ``D == 3``);
* ``obb``: ``output0`` ``(B, 4 + nc + 1, A)``: then the box angle in radians;
* ``classify``: ``output0`` ``(B, nc)``: class probabilities.

Outside export mode they return ``(y, extras)`` tuples that a file must not carry.
:class:`Head` tells the export check which channels mean what; models that are not
Ultralytics' (the built-in detector, a user's) are ``detect`` heads whose channels after
the boxes are all class scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from trtqat.engines.detect_agreement import CLASSES_KEY, HEAD_KEY, KEYPOINTS_KEY
from trtqat.quant.plugins.ultralytics import head_task

Part = tuple[str, "slice | np.ndarray", str]  # label, channel index along axis 1, unit


@dataclass(frozen=True)
class Head:
    """The layout of a detector's outputs: ``task``, ``classes`` (None: every channel after
    the boxes), ``keypoints`` (K, D) of a pose head."""

    task: str = "detect"
    classes: int | None = None
    keypoints: tuple[int, int] = (0, 0)

    @property
    def output_names(self) -> list[str]:
        """Ultralytics' ONNX output names of the head."""
        return ["output0", "output1"] if self.task == "segment" else ["output0"]

    def score_stop(self, channels: int) -> int:
        """The channel after the last class score."""
        return channels if self.classes is None else 4 + self.classes

    def metadata(self) -> dict[str, str]:
        """What an exported file records of the head (``trtqat.head``, ``trtqat.classes``,
        a pose head's ``trtqat.keypoints`` ``K,D``): the engine builders' detection check
        reads only the class channels as class scores
        (:mod:`trtqat.engines.detect_agreement`)."""
        meta = {HEAD_KEY: self.task}
        if self.classes is not None:
            meta[CLASSES_KEY] = str(self.classes)
        if self.task == "pose" and self.keypoints[0]:
            meta[KEYPOINTS_KEY] = f"{self.keypoints[0]},{self.keypoints[1] or 2}"
        return meta

    def parts(self, channels: int) -> list[Part]:
        """The parts of ``output0`` (``channels`` along axis 1), each checked on its own
        scale: boxes (px), class scores, then the task's own channels."""
        stop = self.score_stop(channels)
        parts: list[Part] = [("boxes", slice(0, 4), "px"), ("scores", slice(4, stop), "")]
        if self.task == "segment":
            parts.append(("mask coefficients", slice(stop, channels), ""))
        elif self.task == "obb":
            parts.append(("angles", slice(stop, channels), "rad"))
        elif self.task == "pose":
            dims = self.keypoints[1] or 2
            index = np.arange(stop, channels)
            parts.append(("keypoints", index[(index - stop) % dims < 2], "px"))
            if dims == 3:
                parts.append(("keypoint visibility", index[(index - stop) % dims == 2], ""))
        return parts


def head_of(model: nn.Module) -> Head:
    """The :class:`Head` of ``model`` (``detect`` with unknown classes for models that are
    not Ultralytics')."""
    task = head_task(model)
    if task is None:
        return Head()
    head = model.model[-1]
    if task == "classify":
        return Head(task, int(head.linear.out_features))
    kpts = getattr(head, "kpt_shape", None) if task == "pose" else None
    return Head(task, int(head.nc), tuple(int(k) for k in kpts) if kpts else (0, 0))


def head_of_record(source: dict[str, Any] | None, num_classes: int | None) -> Head:
    """The :class:`Head` of a checkpoint's model record (its Ultralytics yaml, when it has
    one: the task of the yaml's last layer, its ``kpt_shape``), without building it."""
    yaml = (source or {}).get("yaml")
    try:
        name = str(yaml["head"][-1][2])
    except (TypeError, KeyError, IndexError):
        return Head()
    task = {"Segment": "segment", "Pose": "pose", "OBB": "obb"}.get(name.removeprefix("YOLOE"),
                                                                     "detect")
    kpts = tuple(int(k) for k in yaml.get("kpt_shape") or (17, 3)) if task == "pose" else (0, 0)
    return Head(task, num_classes, kpts)  # type: ignore[arg-type]


def export_mode(model: nn.Module) -> None:
    """Before an export (or a prediction): an Ultralytics head in export mode, as
    Ultralytics' exporter sets it (its outputs alone, see the module doc), computing its
    anchors from each input's feature maps (``dynamic``). Otherwise the head compares the
    input with the shape it cached on its last run (calibration, a BatchNorm-fold check),
    and ``torch.export`` fixes the exported batch to that run's."""
    if head_task(model) is None:
        return
    head = model.model[-1]
    head.export = True
    if hasattr(head, "dynamic"):
        head.dynamic = True


def detections(out: Any, head: Head) -> Any:
    """The boxes and class scores ``(B, 4 + nc, A)`` of a detector's eval output (the first
    output of a head that has several, its task channels left out)."""
    y = out[0] if isinstance(out, (tuple, list)) else out
    return y[:, :head.score_stop(int(y.shape[1]))]

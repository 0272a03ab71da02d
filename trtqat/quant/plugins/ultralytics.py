"""Ultralytics detection models handed to :func:`trtqat.quantize` as Ultralytics builds them.

Ultralytics' own QAT, and TensorRT's YOLO guidance, keep a Detect head's final prediction
convs and its DFL conv in float: the DFL's fixed 0..15 weights would otherwise become 0.945,
2.008, ... and the box/class logits lose their tails. The detection family marks these
layers on the models it builds (``trtqat_float_layers``); :func:`head_float_layers` finds
them by structure on any ``DetectionModel`` (recognised by class name: Ultralytics itself
is never imported here), so a model built with ``DetectionModel("yolov8n.yaml")`` or
``YOLO(...).model`` gets the same placement.
"""

from __future__ import annotations

from torch import nn


def is_detection_model(model: nn.Module) -> bool:
    """True for an Ultralytics ``DetectionModel`` (or a subclass)."""
    return any(c.__name__ == "DetectionModel" and c.__module__.startswith("ultralytics")
               for c in type(model).__mro__)


def head_float_layers(model: nn.Module) -> tuple[str, ...]:
    """Glob patterns of the final prediction convs and the DFL conv of an Ultralytics Detect
    head (its index is the last layer's); () for other models."""
    if not is_detection_model(model) or not len(getattr(model, "model", ())):
        return ()
    i = len(model.model) - 1
    head = model.model[-1]
    names = [f"model.{i}.{branch}.*.2" for branch in ("cv2", "cv3", "one2one_cv2", "one2one_cv3")
             if isinstance(getattr(head, branch, None), nn.ModuleList)]
    if isinstance(getattr(head, "dfl", None), nn.Module) and any(
            isinstance(m, nn.Conv2d) for m in head.dfl.modules()):
        names.append(f"model.{i}.dfl*")  # the DFL module and its conv
    return tuple(names)

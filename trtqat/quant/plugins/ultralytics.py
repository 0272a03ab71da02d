"""Ultralytics YOLO models handed to :func:`trtqat.quantize` as Ultralytics builds them.

Ultralytics' own QAT, and TensorRT's YOLO guidance, keep a Detect head's final prediction
convs and its DFL conv in float: the DFL's fixed 0..15 weights would otherwise become 0.945,
2.008, ... and the box/class logits lose their tails. The task heads built on Detect keep
their own final convs in float the same way: a Segment head's mask-coefficient convs and the
last conv of its protos, a Pose head's keypoint convs, an OBB head's angle convs. The
detection family marks these layers on the models it builds (``trtqat_float_layers``);
:func:`head_float_layers` finds them by structure on any ``DetectionModel`` (recognised by
class name: Ultralytics itself is never imported here), so a model built with
``SegmentationModel("yolo11n-seg.yaml")`` or ``YOLO(...).model`` gets the same placement.
"""

from __future__ import annotations

from torch import nn

# the head class (or a base of it) -> Ultralytics' task name; first match in the MRO wins
HEAD_TASKS = {"Segment": "segment", "Pose": "pose", "OBB": "obb", "Classify": "classify",
              "Detect": "detect"}
# what a task head keeps in float beside the box and class convs and the DFL (the NOTE)
TASK_FLOAT = {"segment": ", with its mask-coefficient convs and the protos' last conv",
              "pose": ", with its keypoint convs", "obb": ", with its angle convs"}


def _is_ultralytics(model: nn.Module, *names: str) -> bool:
    return any(c.__name__ in names and c.__module__.startswith("ultralytics")
               for c in type(model).__mro__)


def is_detection_model(model: nn.Module) -> bool:
    """True for an Ultralytics ``DetectionModel`` (or a subclass: segment, pose, OBB)."""
    return _is_ultralytics(model, "DetectionModel")


def is_classification_model(model: nn.Module) -> bool:
    """True for an Ultralytics ``ClassificationModel`` (``yolo11n-cls.yaml``)."""
    return _is_ultralytics(model, "ClassificationModel")


def head_task(model: nn.Module) -> str | None:
    """``detect``, ``segment``, ``pose``, ``obb`` or ``classify``: the task of an Ultralytics
    model's last layer (its head); None for other models and heads."""
    if not (is_detection_model(model) or is_classification_model(model)):
        return None
    layers = getattr(model, "model", None)
    if not isinstance(layers, nn.Sequential) or not len(layers):
        return None
    for cls in type(layers[-1]).__mro__:
        if cls.__name__ in HEAD_TASKS and cls.__module__.startswith("ultralytics"):
            return HEAD_TASKS[cls.__name__]
    return None


def head_float_layers(model: nn.Module) -> tuple[str, ...]:
    """Glob patterns of the final convs of an Ultralytics detection head (its index is the
    last layer's): the box and class prediction convs, the DFL conv, and a task head's mask
    coefficient, keypoint or angle convs (``cv4``) and proto output conv; () for others."""
    if not is_detection_model(model) or not len(getattr(model, "model", ())):
        return ()
    i = len(model.model) - 1
    head = model.model[-1]
    branches = ("cv2", "cv3", "cv4", "one2one_cv2", "one2one_cv3", "one2one_cv4")
    names = [f"model.{i}.{branch}.*.2" for branch in branches
             if isinstance(getattr(head, branch, None), nn.ModuleList)]
    if isinstance(getattr(head, "dfl", None), nn.Module) and any(
            isinstance(m, nn.Conv2d) for m in head.dfl.modules()):
        names.append(f"model.{i}.dfl*")  # the DFL module and its conv
    last = getattr(getattr(head, "proto", None), "cv3", None)
    if isinstance(last, nn.Module):
        names.append(f"model.{i}.proto.cv3*")  # the protos' last conv (and its conv)
    return tuple(names)

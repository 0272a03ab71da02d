"""Which detector ``--model`` names, and how it is built.

* ``yolo_digits`` (alias ``detect``): the built-in detector (:mod:`.yolo`);
* ``detect:path/to/file.py:factory``: a user's detector. The ``detect:`` prefix says it is
  one (without it a ``file.py:factory`` is an image classifier). In eval mode the model
  returns ``(batch, 4 + classes, anchors)``: box centre x, y, width, height in pixels, then
  class scores in [0, 1]; in train mode the raw outputs the family's loss takes (see
  :mod:`.loss`), or anything, with ``--epochs 0`` use (calibration only). Optional
  attributes: ``strides`` (the head's level strides, for the loss), ``trtqat_float_layers``
  (glob patterns of layers kept in float, e.g. the final prediction convs),
  ``input_names``/``output_names`` (the ONNX names);
* an Ultralytics YOLO model (v8, 11, ...): a model ``.yaml`` (``yolov8n.yaml``,
  ``yolo11n.yaml``: Ultralytics' own or a file) or local ``.pt`` weights; needs
  ``pip install 'trtqat[ultralytics]'`` (:mod:`.ultralytics`). An Ultralytics classifier
  (``yolo11n-cls.yaml``) is an image classifier: the CNN family's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from trtqat.errors import TrtqatError

BUILTIN = "yolo_digits"
ALIASES = {"detect": BUILTIN, BUILTIN: BUILTIN}
PREFIX = "detect:"
DEFAULT_NAMES = (["images"], ["output0"])  # Ultralytics' ONNX names, kept for every detector


class DetectorSourceError(TrtqatError, ValueError):
    """A detector cannot be built from what ``--model`` names."""


def kind_of(model: str) -> str | None:
    """``builtin``, ``file``, ``ultralytics`` or None (not a detector)."""
    if not model:
        return None
    if model in ALIASES:
        return "builtin"
    if model.startswith(PREFIX):
        return "file"
    from trtqat.families.ultralytics_files import ultralytics_task

    task = ultralytics_task(model)  # a classifier is the CNN family's (an image classifier)
    return "ultralytics" if task is not None and task != "classify" else None


def arch_name(model: str) -> str:
    """A short, file-name-safe name: ``yolo_digits``, ``my_det.make``, ``yolov8n``."""
    kind = kind_of(model)
    if kind == "builtin":
        return BUILTIN
    if kind == "file":
        from trtqat.families.cnn.model_source import arch_name as file_arch

        return file_arch(model.removeprefix(PREFIX))
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).stem)


def origin(model: str) -> dict[str, Any]:
    """Where ``--model`` comes from: enough to rebuild it (``kind``, ``model``; a file's
    path and SHA-256)."""
    kind = kind_of(model)
    if kind == "file":
        from trtqat.families.cnn.model_source import describe

        info = describe(model.removeprefix(PREFIX))
        return {**info, "model": PREFIX + info["model"], "kind": "file"}
    if kind == "builtin":
        from trtqat.families.detect.yolo import DEFAULT_ACT, WIDTHS

        return {"model": BUILTIN, "kind": "builtin", "widths": list(WIDTHS), "act": DEFAULT_ACT}
    return {"model": model, "kind": "ultralytics"}


def build(model: str, num_classes: int | None, spec_source: dict[str, Any] | None = None
          ) -> nn.Module:
    """The float detector ``model`` names (``spec_source``: a checkpoint's record, which
    holds an Ultralytics model's yaml, so a rebuild needs neither file, and the built-in
    detector's widths and activation: the earlier ones where a checkpoint does not record
    them)."""
    # a checkpoint's record says what it is (its .pt or .yaml need not be there any more)
    kind = (spec_source or {}).get("kind") or kind_of(model)
    if kind == "builtin":
        from trtqat.families.detect import yolo

        if spec_source is None:
            return yolo.yolo_digits(num_classes or 10)
        return yolo.yolo_digits(num_classes or 10, *_builtin_shape(spec_source))
    if kind == "file":
        from trtqat.families.cnn.model_source import build as build_file
        from trtqat.families.cnn.model_source import recorded_sha256

        file = model.removeprefix(PREFIX)  # from a checkpoint: only the file it recorded
        expected = None if spec_source is None else recorded_sha256(file, spec_source)
        return build_file(file, num_classes, expected_sha256=expected)
    if kind == "ultralytics":
        from trtqat.families.detect.ultralytics import build_yolo

        return build_yolo(model, num_classes, (spec_source or {}).get("yaml"))
    raise DetectorSourceError(f"--model {model} is not a detector: use yolo_digits, "
                              "detect:FILE.py:FACTORY, an Ultralytics .yaml or .pt")


def _builtin_shape(source: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """The built-in detector's widths and activation a checkpoint records, checked (the
    earlier model's where it records none)."""
    from trtqat.families.detect.yolo import ACTIVATIONS, LEGACY_ACT, LEGACY_WIDTHS

    widths, act = source.get("widths", LEGACY_WIDTHS), source.get("act", LEGACY_ACT)
    if (not isinstance(widths, (list, tuple)) or len(widths) != 4
            or not all(isinstance(c, int) and 0 < c <= 4096 for c in widths)):
        raise DetectorSourceError(f"the checkpoint records yolo_digits widths {widths!r}: "
                                  "expected 4 channel counts; was it written by trtqat?")
    if act not in ACTIVATIONS:
        raise DetectorSourceError(f"the checkpoint records yolo_digits activation {act!r}: "
                                  f"expected one of {sorted(ACTIVATIONS)}")
    return tuple(widths), act


def float_layers(model: nn.Module) -> tuple[str, ...]:
    """Glob patterns of the layers the family keeps in float by default: the final
    prediction convs (and an Ultralytics head's DFL conv)."""
    from trtqat.families.detect.ultralytics import head_float_layers
    from trtqat.families.detect.yolo import FLOAT_LAYERS, YoloDigits

    if isinstance(model, YoloDigits):
        return FLOAT_LAYERS
    own = getattr(model, "trtqat_float_layers", None)
    if own is not None:
        return tuple(own)
    return head_float_layers(model)


def io_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """The model's ONNX input and output names (``images``/``output0``, and ``output1`` for
    an Ultralytics segmentation head's protos, unless it sets ``input_names``/
    ``output_names``)."""
    from trtqat.families.detect.heads import head_of

    ins = getattr(model, "input_names", None) or DEFAULT_NAMES[0]
    outs = getattr(model, "output_names", None) or head_of(model).output_names
    return list(ins), list(outs)


def strides(model: nn.Module) -> tuple[int, ...] | None:
    """The head's level strides (None when the model does not say)."""
    value = getattr(model, "strides", None)
    return None if value is None else tuple(int(s) for s in value)

"""Ultralytics YOLO detectors (v8, 11, ...) in trtqat: building, the loss, checkpoints.

Optional: ``pip install 'trtqat[ultralytics]'``. Nothing is downloaded: the import sets
``YOLO_OFFLINE=1`` (unless set), models come from a ``.yaml`` (Ultralytics' bundled ones by
name, e.g. ``yolov8n.yaml``) or a local ``.pt``.

* :func:`build_yolo`: a ``DetectionModel`` whose eval forward returns ``(batch, 4 + nc,
  anchors)`` (boxes cx, cy, w, h in pixels, sigmoid scores: the Detect head in export mode);
  its train forward returns the raw head dict Ultralytics' own loss takes.
* :class:`UltralyticsLoss`: Ultralytics' detection loss (task-aligned assigner, BCE, CIoU,
  DFL) on trtqat's batches, what QAT of an Ultralytics model trains with.
* :func:`patch_is_qat`: Ultralytics recognises a QAT model by a module named
  ``TensorQuantizer`` and then imports ModelOpt to save it (``qat_state``/``strip_qat``). A
  trtqat model has such modules, but they are plain classes that pickle, so the patch makes
  ``is_qat`` look at ModelOpt's quantizers only: ``YOLO.save``, the trainer's checkpoints
  and ``YOLO(path)`` then keep trtqat's quantizers in the pickled model. Applied whenever
  trtqat builds or saves an Ultralytics model; call it yourself before Ultralytics code
  touches a trtqat-quantized model otherwise.
* :func:`save_ultralytics`: an Ultralytics checkpoint (``YOLO(path)`` loads it) of a trtqat
  model.
"""

from __future__ import annotations

import copy
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtqat.errors import TrtqatError
from trtqat.quant.plugins.ultralytics import head_float_layers, head_task
from trtqat.quant.plugins.ultralytics import is_detection_model as is_yolo


class UltralyticsModelError(TrtqatError, ValueError):
    """An Ultralytics model trtqat cannot use (another task, unreadable weights)."""


def _ultralytics():
    """``ultralytics.nn.tasks``, imported offline (no downloads, no settings sync)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_VERBOSE", "False")
    from trtqat.optional import require

    tasks = require("ultralytics.nn.tasks", "ultralytics", "Ultralytics YOLO models")
    patch_is_qat()
    return tasks


def _ready(net: nn.Module) -> nn.Module:
    """Hyperparameters for the loss, and the head's export-mode output."""
    from ultralytics.cfg import get_cfg

    if not is_yolo(net):
        raise UltralyticsModelError(f"{type(net).__name__} is not a detection model: trtqat's "
                                    "detect family takes Ultralytics detection, segmentation, "
                                    "pose and OBB models (yolo11n.yaml, yolo11n-seg.yaml, ..., "
                                    "or their .pt)")
    net.args = get_cfg()
    head = net.model[-1]
    head.export = True  # eval: the head's export outputs alone (see .heads)
    net.trtqat_float_layers = head_float_layers(net)  # trtqat.quantize keeps them float
    if getattr(head, "one2one_cv2", None) is not None and getattr(head, "cv2", None) is not None:
        head.end2end = False  # the one-to-many outputs: NMS is trtqat's (or the export's)
    return net.float()


def anchors_follow_input(model: nn.Module) -> None:
    """Before an export: an Ultralytics head in export mode, its anchors computed from each
    input (see :func:`.heads.export_mode`)."""
    from trtqat.families.detect.heads import export_mode

    export_mode(model)


def _task_model(tasks: Any, cfg: Any) -> Any:
    """The Ultralytics model class of a yaml's head (``DetectionModel``, ``SegmentationModel``,
    ``PoseModel``, ``OBBModel``); a one-line error for the tasks trtqat does not build."""
    task = tasks.guess_model_task(cfg)
    classes = {"detect": tasks.DetectionModel, "segment": tasks.SegmentationModel,
               "pose": tasks.PoseModel, "obb": tasks.OBBModel}
    if task not in classes:
        name = cfg if isinstance(cfg, (str, Path)) else (cfg or {}).get("yaml_file", "the yaml")
        raise UltralyticsModelError(f"--model {name} is an Ultralytics {task} model: the "
                                    "detection family builds detection, segmentation, pose and "
                                    "OBB models (a classifier is an image classifier: trtqat "
                                    "calibrate --model builds it as one)")
    return classes[task]


def build_yolo(source: str, num_classes: int | None, yaml: dict[str, Any] | None = None
               ) -> nn.Module:
    """An Ultralytics detector from a ``.yaml``, a ``.pt`` or a checkpoint's recorded yaml
    (``yaml``), with ``num_classes`` classes (default: the model's own)."""
    if yaml is None and Path(source).suffix.lower() == ".pt":
        check_trusted(source)  # before anything imports or unpickles it
    tasks = _ultralytics()
    if yaml is not None:
        cfg = copy.deepcopy(yaml)
        return _ready(_task_model(tasks, cfg)(cfg, nc=num_classes or cfg.get("nc"),
                                              verbose=False))
    if Path(source).suffix.lower() == ".pt":
        path = Path(source).expanduser()
        try:  # the user's own Ultralytics file: Ultralytics unpickles it
            net = tasks.load_checkpoint(str(path))[0]
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one line
            raise UltralyticsModelError(f"cannot load Ultralytics weights {path}: "
                                        f"{type(exc).__name__}: {str(exc)[:200]}") from None
        net = net.float()
        if num_classes and num_classes != int(net.model[-1].nc):
            fresh = tasks.DetectionModel(copy.deepcopy(net.yaml), nc=num_classes, verbose=False)
            fresh.load(net, verbose=False)  # every layer but the class outputs
            net = fresh
        return _ready(net)
    try:
        cfg = tasks.yaml_model_load(source)
    except FileNotFoundError:
        raise UltralyticsModelError(f"--model {source}: no such Ultralytics model yaml (a "
                                    "file, or a bundled name such as yolov8n.yaml)") from None
    return _ready(_task_model(tasks, cfg)(cfg, nc=num_classes, verbose=False))


def check_trusted(source: str) -> None:
    """Refuse an Ultralytics ``.pt`` unless ``--trust-model-file``: Ultralytics unpickles it,
    and unpickling runs whatever code the file carries."""
    from trtqat.families.ultralytics_files import untrusted_pt

    refused = untrusted_pt(source)
    if refused:
        raise UltralyticsModelError(refused)


def yaml_of(model: nn.Module) -> dict[str, Any] | None:
    """The model's yaml dict (what a checkpoint records to rebuild it)."""
    return copy.deepcopy(getattr(model, "yaml", None)) if is_yolo(model) else None


def batch_of(targets: list[torch.Tensor], image_hw: tuple[int, int], device) -> dict:
    """trtqat's per-image ``(n, 5)`` pixel xyxy targets as an Ultralytics batch."""
    h, w = image_hw
    rows = [torch.cat((torch.full((len(t), 1), float(i)), t.cpu()), 1)
            for i, t in enumerate(targets)]
    t = torch.cat(rows) if rows else torch.zeros(0, 6)
    xyxy = t[:, 2:6]
    xywh = torch.stack(((xyxy[:, 0] + xyxy[:, 2]) / 2 / w, (xyxy[:, 1] + xyxy[:, 3]) / 2 / h,
                        (xyxy[:, 2] - xyxy[:, 0]) / w, (xyxy[:, 3] - xyxy[:, 1]) / h), 1)
    return {"batch_idx": t[:, 0].to(device), "cls": t[:, 1:2].to(device),
            "bboxes": xywh.to(device)}


class UltralyticsLoss(nn.Module):
    """Ultralytics' own detection loss of ``model`` (box + cls + DFL, with its gains), per
    image."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        task = head_task(model)
        if task != "detect":  # its loss needs masks, keypoints or angles the data lacks
            raise UltralyticsModelError(f"trtqat trains Ultralytics detection models only: "
                                        f"this {task} model can be calibrated and exported "
                                        "(trtqat calibrate, trtqat export), not trained "
                                        "(trtqat train, trtqat qat)")
        self.criterion = model.init_criterion()

    def forward(self, preds: Any, targets: list[torch.Tensor], image_hw: tuple[int, int]
                ) -> torch.Tensor:
        device = next(iter(preds["feats"])).device
        loss, _ = self.criterion(preds, batch_of(targets, image_hw, device))
        return loss.sum() / max(len(targets), 1)


def patch_is_qat() -> None:
    """Make Ultralytics' ``is_qat`` ignore trtqat's quantizers (see the module doc)."""
    import sys

    from ultralytics.utils import torch_utils

    original = torch_utils.is_qat
    if getattr(original, "_trtqat", False):
        return

    def is_qat(model: nn.Module) -> bool:
        inner = model.model if isinstance(getattr(model, "model", None), nn.Module) else model
        return any(type(m).__name__ == "TensorQuantizer"
                   and not type(m).__module__.startswith("trtqat") for m in inner.modules())

    is_qat._trtqat = True  # type: ignore[attr-defined]
    is_qat.__doc__ = original.__doc__
    for name, module in list(sys.modules.items()):
        if name.startswith("ultralytics") and getattr(module, "is_qat", None) is original:
            module.is_qat = is_qat


def save_ultralytics(model: nn.Module, path: str | Path, **extra: Any) -> Path:
    """Write ``model`` (an Ultralytics detector, quantized by trtqat or not) as an
    Ultralytics checkpoint that ``YOLO(path)`` loads, quantizers and amax included."""
    from trtqat.atomic import write_atomic

    if not is_yolo(model):
        raise UltralyticsModelError("save_ultralytics takes an Ultralytics DetectionModel")
    from ultralytics import __version__

    patch_is_qat()
    net = copy.deepcopy(model).float().eval()
    net.model[-1].export = False  # Ultralytics' own predictors expect the (y, x) tuple
    ckpt = {"model": net, "ema": None, "train_args": dict(vars(getattr(net, "args", {}) or {})),
            "date": datetime.now().isoformat(), "version": __version__, **extra}
    return write_atomic(Path(path), lambda f: torch.save(ckpt, f))

"""Ultralytics classifiers (``yolo11n-cls.yaml``, a classify ``.pt``): image classifiers of
the CNN family, from the command line as from ``trtqat.quantize``.

* Built offline (``YOLO_OFFLINE=1``, nothing downloaded) from a model yaml (Ultralytics'
  bundled ones by name) or a local ``.pt`` (Ultralytics unpickles it: only with
  ``--trust-model-file``). A checkpoint records the model's yaml (:func:`record`), so
  ``export`` and ``compare`` rebuild it from the checkpoint alone: neither file is needed,
  and a ``.pt`` is never unpickled again.
* Classes: ``num_classes`` sets the ``Classify`` head's ``nc`` (a ``.pt`` keeps every other
  layer's weights, its new head starts from random values); None keeps the model's own.
* Outputs: logits in training and evaluation (a hook on the head picks them from its eval
  pair (probabilities, logits)), what cross-entropy and the CNN family's metrics take; the
  export puts the head in export mode as Ultralytics' exporter does (:func:`export_mode`):
  ``images`` -> ``output0``, the softmax probabilities.
* Quantized like every CNN classifier, the final Linear included.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from pathlib import Path
from typing import Any

from torch import nn

from trtqat.families.cnn.model_file import ModelSourceError
from trtqat.quant.plugins.ultralytics import is_classification_model

KIND = "ultralytics"
IO_NAMES = (["images"], ["output0"])  # Ultralytics' ONNX names
log = logging.getLogger(__name__)


def is_classifier(source: str) -> bool:
    """True when ``source`` is an Ultralytics classifier's ``.yaml`` or ``.pt`` (read, not
    built or unpickled)."""
    from trtqat.families.ultralytics_files import ultralytics_task

    return Path(source).suffix.lower() in (".yaml", ".yml", ".pt") and \
        ultralytics_task(source) == "classify"


def arch_name(source: str) -> str:
    """``yolo11n-cls`` for ``yolo11n-cls.yaml`` (file-name safe)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(source).stem)


def describe(source: str) -> dict[str, Any]:
    """Where the model comes from (the yaml itself is added by :func:`record`)."""
    path = Path(source).expanduser()
    return {"model": str(path.resolve()) if path.is_file() else source, "kind": KIND}


def record(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint records of a built Ultralytics classifier to rebuild it: its yaml
    (``{}`` for other models)."""
    if not is_classification_model(model):
        return {}
    return {"yaml": copy.deepcopy(model.yaml)}


def _tasks() -> Any:
    """``ultralytics.nn.tasks``, imported offline."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_VERBOSE", "False")
    from trtqat.optional import require

    return require("ultralytics.nn.tasks", "ultralytics", "Ultralytics classifiers")


def _logits(module: nn.Module, args: Any, out: Any) -> Any:
    """Forward hook of the Classify head: its eval pair (probabilities, logits) -> logits."""
    return out[1] if isinstance(out, tuple) and len(out) == 2 else None


def _ready(net: nn.Module) -> nn.Module:
    if not is_classification_model(net):
        raise ModelSourceError(f"{type(net).__name__} is not an Ultralytics classifier")
    net = net.float()
    head = net.model[-1]
    head.export = False
    head.register_forward_hook(_logits)
    net.input_names, net.output_names = list(IO_NAMES[0]), list(IO_NAMES[1])
    return net


def _load_pt(tasks: Any, source: str, num_classes: int | None) -> nn.Module:
    from trtqat.families.ultralytics_files import untrusted_pt

    refused = untrusted_pt(source)
    if refused:
        raise ModelSourceError(refused)
    path = Path(source).expanduser()
    try:  # the user's own Ultralytics file: Ultralytics unpickles it
        net = tasks.load_checkpoint(str(path))[0].float()
    except Exception as exc:  # noqa: BLE001 - any unreadable file: one line
        raise ModelSourceError(f"cannot load Ultralytics weights {path}: "
                               f"{type(exc).__name__}: {str(exc)[:200]}") from None
    own = int(net.model[-1].linear.out_features)
    if num_classes and num_classes != own:
        log.warning("NOTE %s predicts %d classes; its Classify head is rebuilt for %d (from "
                    "random values, every other layer keeps its weights)", path.name, own,
                    num_classes)
        tasks.ClassificationModel.reshape_outputs(net, num_classes)
        net.yaml["nc"] = num_classes
    return net


def build(source: str, num_classes: int | None = None, yaml: dict[str, Any] | None = None,
          channels: int | None = None) -> nn.Module:
    """The float Ultralytics classifier ``source`` names (``yaml``: a checkpoint's record,
    which then builds it), with ``num_classes`` classes (None: the model's own)."""
    tasks = _tasks()
    if yaml is None and Path(source).suffix.lower() == ".pt":
        return _ready(_load_pt(tasks, source, num_classes))
    if yaml is not None:
        cfg = copy.deepcopy(yaml)
    else:
        try:
            cfg = tasks.yaml_model_load(source)
        except FileNotFoundError:
            raise ModelSourceError(f"--model {source}: no such Ultralytics model yaml (a file, "
                                   "or a bundled name such as yolo11n-cls.yaml)") from None
    ch = int(cfg.get("channels") or channels or 3)
    try:
        net = tasks.ClassificationModel(cfg, ch=ch, nc=num_classes or cfg.get("nc"),
                                        verbose=False)
    except Exception as exc:  # noqa: BLE001 - a yaml Ultralytics cannot build: one line
        raise ModelSourceError(f"Ultralytics cannot build {source}: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    return _ready(net)


def export_mode(model: nn.Module) -> None:
    """Before an export: an Ultralytics classifier's head returns its softmax probabilities
    alone, as Ultralytics' exporter writes ``output0`` (a no-op for other models)."""
    if is_classification_model(model):
        model.model[-1].export = True

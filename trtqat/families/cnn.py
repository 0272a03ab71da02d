"""CNN image classifiers (torchvision, timm, ``file.py:factory``): the fallback family."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from torch import nn

from trtqat.families.base import ExportInputs, ModelFamily


class CNNFamily(ModelFamily):
    """Image classifiers trained with cross-entropy, checked by top-1 agreement."""

    name = "cnn"
    task = "classification"
    summary = "image classifiers: torchvision or timm names, or path/to/file.py:factory"

    def claims_model(self, model: str) -> bool:
        """Every model no earlier family claims."""
        return True

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        """Checkpoints without a family tag (every CNN checkpoint ever written) or tagged cnn."""
        return (ckpt.get("model") or {}).get("family") in (None, self.name)

    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """A float model from a torchvision/timm name or ``file.py:factory``."""
        from trtqat.train.model_source import build

        return build(model, num_classes)

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The model of a CNN checkpoint, with its weights."""
        from trtqat.train.checkpoint import build_from_checkpoint

        return build_from_checkpoint(ckpt, quantized)

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
        """Quant* layers in place (activations histogram-calibrated); ``skip_layers`` float."""
        from trtqat.quant.model_ops import QuantConfig, disable_layers, quantize
        from trtqat.train.models import QUANT_DESC_INPUT

        quantize(model, QuantConfig(quant_desc_input=QUANT_DESC_INPUT))
        if skip_layers:
            disable_layers(model, tuple(skip_layers))
        return model

    # The hooks below are filled in by the family restructuring (issue 18).
    def data(self, cfg: Any, split: str) -> Iterable[Any]:
        raise NotImplementedError

    def recipe(self, cfg: Any) -> dict[str, Any]:
        raise NotImplementedError

    # ---- export, compare, sensitivity (issue 18, part B) -----------------------------
    def metric(self, outputs: Any, targets: Any) -> dict[str, float]:
        """Top-1 (and top-5 with more than 5 classes) in percent: logits vs labels."""
        logits = np.asarray(outputs, dtype=np.float32)
        labels = np.asarray(targets).reshape(-1)
        k = min(5, logits.shape[1])
        top = np.argsort(-logits, axis=1)[:, :k]
        total = max(len(labels), 1)
        metrics = {"top1": 100.0 * float((top[:, 0] == labels).sum()) / total}
        if logits.shape[1] > 5:
            metrics["top5"] = 100.0 * float((top == labels[:, None]).any(axis=1).sum()) / total
        return metrics

    def export_inputs(self, model: nn.Module, spec: dict[str, Any], batch: int | None
                      ) -> ExportInputs:
        """Random images of ``spec["input_size"]`` (h, w) and ``channels`` (default: the
        checkpoint's ``image_size``, 3), ``batch`` rows (2 when dynamic); ``spec["dynamic"]``
        names the dynamic axes (batch, height, width)."""
        from trtqat.export.onnx_export import make_example_inputs

        size = spec.get("input_size") or spec.get("image_size") or 32
        images = make_example_inputs(size, batch or 2, int(spec.get("channels") or 3))
        axes = tuple(spec.get("dynamic", ("batch",) if batch is None else ()))
        where = {"batch": 0, "height": 2, "width": 3}
        dims = {where[a]: a for a in axes if a in where}
        return ExportInputs((images,), ["input"], ["output"],
                            {"input": dims, "output": {0: "batch"} if 0 in dims else {}})

    def export_check(self, variant: str, reference: Sequence[Any], candidate: Sequence[Any],
                     context: Any = None) -> list[Any]:
        """Each output within the variant's tolerance (INT8: the noise-floor criterion),
        top-1 agreement on the validation data, the Q/DQ inventory of INT8 files."""
        from trtqat.export.checks import classifier_checks

        return classifier_checks(variant, reference, candidate, context)

    def export_plan(self, model: nn.Module, ckpt: dict[str, Any], options: Any) -> Any:
        """Example images, the validation split, ``--skip-layers`` (see ``image_export``)."""
        from trtqat.train.export_run import image_export

        return image_export(self, model, ckpt, options)

    def compare_data(self, variants: Sequence[Any], settings: dict[str, Any], cfg: Any) -> Any:
        """Labelled validation images and calibration images of the runs' data."""
        from trtqat.compare.data import image_data

        return image_data(self, variants, settings, cfg)

    def sensitivity_data(self, ckpt: dict[str, Any], cfg: Any, device: Any) -> tuple[list, dict]:
        """Validation ``(images, labels)`` batches of the checkpoint's data, in memory."""
        from trtqat.train.sensitivity_report import image_batches

        return image_batches(ckpt, cfg, device)

"""The model-family interface: what varies between model families, in one place.

Stages (train, calibrate, qat, export, compare, sensitivity, demo) find the family once with
:func:`trtqat.families.of_checkpoint` / :func:`trtqat.families.of_model` and call these hooks;
nothing outside ``trtqat/families/`` tests a family name.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn


@dataclass
class ExportInputs:
    """What export needs: example inputs, ONNX input/output names, dynamic axes."""

    example: tuple[Any, ...]                 # positional inputs of model.forward
    input_names: list[str]
    output_names: list[str]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)


@dataclass
class EngineHints:
    """Hints for engine builders (e.g. ORT graph rewrites worth applying)."""

    ort_rewrites: tuple[str, ...] = ()       # names understood by trtqat.engines.ort_qdq_rewrite
    fp16_sensitive_ops: tuple[str, ...] = ()  # ops to keep in fp32 in mixed fp16 builds


class ModelFamily(abc.ABC):
    """One model family (CNN classifiers, sentence encoders, Vision Transformers, ...).

    Subclass, implement the abstract hooks, and add one line to ``trtqat/families/registry.py``.
    """

    name: ClassVar[str]            # registry key: "cnn", "encoder", "vit"
    checkpoint_tag: ClassVar[str | None] = None  # ckpt["model"]["family"]; None: the name
    task: ClassVar[str]            # "classification" (labels, top-1) | "embedding" (cosine)
    summary: ClassVar[str]         # one line for --help

    # ---- finding the family -------------------------------------------------------------
    @abc.abstractmethod
    def claims_model(self, model: str) -> bool:
        """True when ``--model MODEL`` names a model of this family."""

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        """True when a loaded checkpoint holds a model of this family (``model.family``)."""
        return (ckpt.get("model") or {}).get("family") == (self.checkpoint_tag or self.name)

    # ---- models -------------------------------------------------------------------------
    @abc.abstractmethod
    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """A float model from ``--model`` (name, folder or file.py:factory)."""

    @abc.abstractmethod
    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """Rebuild the model a checkpoint describes, with its weights (``quantized=True`` on
        an FP32 checkpoint: an uncalibrated quantized copy, the start of PTQ)."""

    @abc.abstractmethod
    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
        """Insert the quantizers this family needs (layers, residual adds, attention matmuls)."""

    # ---- data, recipe, metrics ----------------------------------------------------------
    @abc.abstractmethod
    def data(self, cfg: Any, split: str) -> Iterable[Any]:
        """Batches for ``split`` in ("train", "calib", "val")."""

    @abc.abstractmethod
    def recipe(self, cfg: Any) -> dict[str, Any]:
        """Default QAT recipe: epochs, lr, optimizer, and the loss ("ce" | "distill")."""

    @abc.abstractmethod
    def metric(self, outputs: Any, targets: Any) -> dict[str, float]:
        """What compare and sensitivity report (top-1 / cosine ...)."""

    # ---- export and engines -------------------------------------------------------------
    @abc.abstractmethod
    def export_inputs(self, model: nn.Module, spec: dict[str, Any], batch: int | None
                      ) -> ExportInputs:
        """Example inputs, names and dynamic axes for ONNX export."""

    @abc.abstractmethod
    def export_check(self, variant: str, reference: Sequence[Any], candidate: Sequence[Any],
                     context: Any = None) -> list[Any]:
        """The exported file against PyTorch: pass/fail lines (``trtqat.export.validate.Check``)
        from each validation batch's outputs and a ``trtqat.export.checks.CheckContext``."""

    def engine_hints(self) -> EngineHints:
        """Hints for engine builders; none by default."""
        return EngineHints()

    # ==== stage adapters: export, compare, sensitivity (issue 18, part B) =================
    # Image families inherit the CNN's; each returns what the stage's own module defines.
    def export_plan(self, model: nn.Module, ckpt: dict[str, Any], options: Any) -> Any:
        """How ``trtqat export`` exports this family's checkpoint with ``options``
        (``trtqat.train.export_run.ExportOptions``): a ``FamilyExport`` (plan, file arch)."""
        raise NotImplementedError(f"the {self.name} family has no ONNX export")

    def compare_data(self, variants: Sequence[Any], settings: dict[str, Any], cfg: Any) -> Any:
        """What ``trtqat compare`` measures every variant on (``trtqat.compare.data.EvalData``)."""
        raise NotImplementedError(f"the {self.name} family has no compare data")

    def sensitivity_data(self, ckpt: dict[str, Any], cfg: Any, device: Any) -> tuple[list, dict]:
        """``(batches of (inputs, targets), info)`` that ``trtqat sensitivity`` scores."""
        raise NotImplementedError(f"`trtqat sensitivity` does not analyse {self.name} models "
                                  "yet: pass the best.pt of a CNN calibrate/qat run")

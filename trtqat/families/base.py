"""The model-family interface: what varies between model families, in one place.

Stages (train, calibrate, qat, export, compare, sensitivity, demo) find the family once with
:func:`trtqat.families.of_checkpoint` / :func:`trtqat.families.of_model` and call these hooks;
nothing outside ``trtqat/families/`` tests a family name.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from trtqat.engines.hints import EngineHints
from trtqat.errors import TrtqatError
from trtqat.families.types import (
    EvalData,
    ExportInputs,
    FamilyExport,
    StageData,
    StageResult,
    Variant,
)

if TYPE_CHECKING:  # the stages' configs, for the hooks' signatures only
    from trtqat.export.checks import CheckContext
    from trtqat.export.onnx_export import ExportPlan
    from trtqat.export.validate import Check
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.compare.run import CompareConfig
    from trtqat.stages.export import ExportOptions
    from trtqat.stages.qat import QATConfig
    from trtqat.stages.sensitivity_sweep import SensitivityConfig
    from trtqat.stages.train import TrainConfig

    StageConfig = TrainConfig | CalibrateConfig | QATConfig

FAMILY_KEY = "trtqat.family"  # ONNX metadata: the family an exported file came from


class UnsupportedStageError(TrtqatError, ValueError):
    """A stage this model family does not have (e.g. ``trtqat train`` of an encoder)."""


class ModelFamily(abc.ABC):
    """One model family (CNN classifiers, sentence encoders, Vision Transformers, ...).

    Subclass, implement the abstract hooks, and add one line to ``trtqat/families/registry.py``.
    """

    name: ClassVar[str]            # registry key: "cnn", "encoder", "vit"
    checkpoint_tag: ClassVar[str | None] = None  # ckpt["model"]["family"]; None: the name
    task: ClassVar[str]            # "classification" (labels, top-1) | "embedding" (cosine)
    summary: ClassVar[str]         # one line for --help
    spec_keys: ClassVar[tuple[str, ...]] = ("arch",)  # what ckpt["model"] must hold
    # a run's headline score: its entry in stage results and checkpoints, and its label
    score_key: ClassVar[str] = "best_top1"
    score_label: ClassVar[str] = "top-1 %"

    # ---- finding the family -------------------------------------------------------------
    @abc.abstractmethod
    def claims_model(self, model: str) -> bool:
        """True when ``--model MODEL`` names a model of this family."""

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        """True when a loaded checkpoint holds a model of this family (``model.family``)."""
        return (ckpt.get("model") or {}).get("family") == (self.checkpoint_tag or self.name)

    def claims_module(self, model: nn.Module) -> bool:
        """True when an in-memory ``model`` (``trtqat.export_onnx``) is one of this
        family's; none claim by default."""
        return False

    def claims_onnx(self, input_names: Sequence[str]) -> bool:
        """True when an ONNX file without trtqat metadata looks like this family's (its
        graph input names); none claim by default."""
        return False

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
    def data(self, cfg: StageConfig, split: str, **context: Any) -> StageData:
        """The data of a stage: ``split`` "train" (training batches and validation) or
        "calib" (calibration batches and validation); ``context`` holds what the stage
        resolved (the data source, preprocessing, batch size, ...)."""

    @abc.abstractmethod
    def recipe(self, stage: str, cfg: StageConfig | None, source: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """The defaults of ``stage`` ("calibrate": the amax ``method``; "qat": epochs, lr,
        optimizer ..., and the ``loss``, "ce" or "distill") for the options ``cfg`` leaves
        None, given the input checkpoint ``source``."""

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
                     context: CheckContext | None = None) -> list[Check]:
        """The exported file against PyTorch: pass/fail lines (``trtqat.export.validate.Check``)
        from each validation batch's outputs and a ``trtqat.export.checks.CheckContext``."""

    def engine_hints(self) -> EngineHints:
        """Hints for engine builders (``trtqat.engines.hints``); none by default."""
        return EngineHints()

    def stamp_plan(self, plan: Any) -> Any:
        """``plan`` (an ``ExportPlan``) with what every ONNX file of this family carries: the
        ``trtqat.family`` and engine-hint metadata, and the hints' fp16-sensitive ops kept
        float32 in fp16 variants."""
        hints = self.engine_hints()
        metadata = {FAMILY_KEY: self.name, **hints.metadata(), **plan.metadata}
        return dataclasses.replace(plan, metadata=metadata,
                                   float32_ops=tuple(hints.fp16_sensitive_ops))

    # ---- stage adapters: export, compare, sensitivity ---------------------------------
    # Image families inherit the CNN's; each returns what the stage's own module defines.
    def export_plan(self, model: nn.Module, ckpt: dict[str, Any], options: ExportOptions
                    ) -> FamilyExport:
        """How ``trtqat export`` exports this family's checkpoint with ``options``
        (``trtqat.stages.export.ExportOptions``): a ``FamilyExport`` (plan, file arch)."""
        raise UnsupportedStageError(f"the {self.name} family has no ONNX export")

    def module_plan(self, model: nn.Module, example_inputs: Any, **options: Any) -> ExportPlan:
        """How ``trtqat.export_onnx`` exports an in-memory ``model`` of this family from
        ``example_inputs`` (a tensor, tuple or dict by ``forward`` argument name);
        ``options``: ``dynamic_batch``, ``dynamic_axes``, ``validation_data``, ``fold_bn``."""
        raise UnsupportedStageError(f"the {self.name} family has no ONNX export")

    def load_variant(self, variant: Variant) -> nn.Module:
        """The model of a compare variant, from its checkpoint (quantized for the quantized
        variants: int8, fp8, int4), in eval mode."""
        from trtqat.runs.checkpoint import load_checkpoint
        from trtqat.variants import variant as variant_row

        ckpt = load_checkpoint(variant.checkpoint)
        return self.load(ckpt, quantized=variant_row(variant.export_variant).quantized).eval()

    def compare_data(self, variants: Sequence[Variant], settings: dict[str, Any],
                     cfg: CompareConfig) -> EvalData:
        """What ``trtqat compare`` measures every variant on."""
        raise UnsupportedStageError(f"the {self.name} family has no compare data")

    def sensitivity_data(self, ckpt: dict[str, Any], cfg: SensitivityConfig, device: Any
                         ) -> tuple[list, dict]:
        """``(batches of (inputs, targets), info)`` that ``trtqat sensitivity`` scores."""
        raise UnsupportedStageError(f"`trtqat sensitivity` does not analyse {self.name} models "
                                  "yet: pass the best.pt of a CNN calibrate/qat run")

    # ---- stages -------------------------------------------------------------------------
    # The library verbs (trtqat.stages: train_fp32, calibrate, qat_finetune) find the family
    # once and call these; a family without a stage says so in one line.
    def run_train(self, cfg: TrainConfig) -> StageResult:
        """``trtqat train``: FP32 training from ``cfg`` (a ``TrainConfig``)."""
        raise UnsupportedStageError(f"{self.summary.split(':')[0]} are not trained by trtqat "
                                    "train: start from a pretrained model with trtqat "
                                    "calibrate --model NAME")

    def run_calibrate(self, cfg: CalibrateConfig, source: dict[str, Any] | None) -> StageResult:
        """``trtqat calibrate``: PTQ from ``cfg`` (a ``CalibrateConfig``); ``source`` is the
        loaded ``--checkpoint`` (None: start from ``cfg.model``)."""
        raise UnsupportedStageError(f"{self.name} models cannot be calibrated")

    def run_qat(self, cfg: QATConfig, source: dict[str, Any]) -> StageResult:
        """``trtqat qat``: QAT from ``cfg`` (a ``QATConfig``) and the loaded calibrated
        checkpoint ``source``."""
        raise UnsupportedStageError(f"{self.name} models cannot be fine-tuned")

    @abc.abstractmethod
    def describe(self, stage: str, result: StageResult) -> str:
        """The closing line of a stage's command: what the run reached, and its folder."""

"""CNN image classifiers (torchvision, timm, ``file.py:factory``): the fallback family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from trtqat.families.base import ExportInputs, ModelFamily, StageData, StageResult
from trtqat.families.types import EvalData, FamilyExport, Variant

if TYPE_CHECKING:
    from trtqat.export.checks import CheckContext
    from trtqat.export.onnx_export import ExportPlan
    from trtqat.export.validate import Check
    from trtqat.families.base import StageConfig
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.compare.run import CompareConfig
    from trtqat.stages.export import ExportOptions
    from trtqat.stages.qat import QATConfig
    from trtqat.stages.sensitivity_sweep import SensitivityConfig
    from trtqat.stages.train import TrainConfig


class CNNFamily(ModelFamily):
    """Image classifiers trained with cross-entropy, checked by top-1 agreement."""

    name = "cnn"
    task = "classification"
    summary = ("image classifiers: torchvision or timm names, path/to/file.py:factory, or an "
               "Ultralytics classifier .yaml/.pt")

    def claims_model(self, model: str) -> bool:
        """Every model name no earlier family claims, ``path/to/file.py:factory`` and an
        Ultralytics classifier's ``.yaml``/``.pt``; not another path (``families.of_model``
        then lists what ``--model`` takes)."""
        from trtqat.families.cnn.model_source import FILE_SOURCE
        from trtqat.families.cnn.ultralytics_cls import is_classifier
        from trtqat.families.model_paths import is_path_like

        return (not is_path_like(model) or model.startswith("timm:")
                or FILE_SOURCE.match(model) is not None or model.endswith(".py")
                or is_classifier(model))

    def claims_module(self, model: nn.Module) -> bool:
        """Every in-memory model no earlier family claims."""
        return True

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        """Checkpoints without a family tag (every CNN checkpoint ever written) or tagged cnn."""
        return (ckpt.get("model") or {}).get("family") in (None, self.name)

    spec_keys = ("arch", "num_classes")

    # ---- models: every stage builds, loads and quantizes through these ------------------
    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """A float model from a torchvision/timm name, ``file.py:factory`` or an Ultralytics
        classifier (options: ``expected_sha256``, the model file's recorded digest, and
        ``record``, the checkpoint's ``model.source``, when rebuilding a checkpoint;
        ``channels``: the input's)."""
        from trtqat.families.cnn.model_source import build

        return build(model, num_classes, expected_sha256=options.get("expected_sha256"),
                     record=options.get("record"), channels=options.get("channels"))

    def arch(self, model: str) -> str:
        """The short, file-name-safe name a checkpoint records for ``--model``."""
        from trtqat.families.cnn.model_source import arch_name

        return arch_name(model)

    def origin(self, model: str) -> dict[str, Any]:
        """Where ``--model`` comes from (checkpoint ``model.source``: enough to rebuild it)."""
        from trtqat.families.cnn.model_source import describe

        return describe(model)

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The model of a checkpoint, with its weights: ``self.build``, then ``self.quantize``
        when quantized (``quantized=True`` on an FP32 checkpoint: the start of PTQ)."""
        from trtqat.families.cnn.model_source import recorded_sha256, source_of

        spec = ckpt["model"]
        quantized = bool(spec.get("quantized")) if quantized is None else quantized
        source = source_of(spec)
        expected = recorded_sha256(source, spec.get("source") or {})
        return restore(self, self.build(source, int(spec["num_classes"]),
                                        expected_sha256=expected, record=spec.get("source")),
                       ckpt, quantized)

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = (),
                 placement: str | None = None) -> nn.Module:
        """TensorRT's Q/DQ placement in place (``trtqat.quant.placement``: layers, residual
        Adds, Concat/MaxPool shared scales, attention), activations histogram-calibrated;
        ``skip_layers`` stay float. ``placement``: the one a checkpoint was calibrated with
        (``placement_of(spec)``; None: the current one)."""
        from trtqat.families.cnn.models import quantize_classifier

        quantize_classifier(model, skip_layers, placement)
        return model

    # ---- data and recipe ----------------------------------------------------------------
    def data(self, cfg: StageConfig, split: str, **context: Any) -> StageData:
        """Image batches. ``context``: ``data`` (digits, synthetic, a folder, an array),
        ``prep`` (Preprocess), ``batch_size``, ``num_classes``, ``distributed``.

        "train": shuffled, augmented training batches and the validation loader; "calib":
        calibration batches (eval transforms; a flat folder or an array works too) and the
        validation loader when the data has labels. ``info["prep"]``: the preprocessing (an
        array sets its own size).
        """
        from trtqat.families.cnn.data import calibration_datasets, make_loader, make_loaders

        prep, batch = context["prep"], context["batch_size"]
        common = {"workers": cfg.workers, "seed": cfg.seed,
                  "distributed": context.get("distributed", False)}
        if split == "train":
            train, val, classes = make_loaders(
                context["data"], prep.image_size, batch, num_classes=context.get("num_classes"),
                strict=cfg.strict, prep=prep, **common)
            return StageData(train, val, classes, {"prep": prep})
        if split != "calib":
            raise ValueError(f"unknown split {split!r}: use train or calib")
        train_ds, val_ds, classes, prep = calibration_datasets(
            context["data"], prep, cfg.seed, num_classes=context.get("num_classes"),
            strict=cfg.strict)
        val = None if val_ds is None else make_loader(val_ds, batch, train=False, **common)
        # calibration takes what there is: a batch clipped to the samples, none dropped
        calib_batch = max(1, min(batch, len(train_ds)))
        return StageData(make_loader(train_ds, calib_batch, train=True, keep_last=True,
                                     **common), val, classes, {"prep": prep})

    def recipe(self, stage: str, cfg: StageConfig | None, source: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """train: the FP32 defaults, or the model's own (``train_recipes``); calibrate:
        ``trtqat.quant.api.CNN_METHOD`` (max: the best PTQ top-1 measured); qat: TensorRT's guidance from the FP32 run the checkpoint records (10% of
        its epochs, 1% of its lr, cosine to 1% of that), cross-entropy."""
        if stage == "train":
            from trtqat.families.cnn.train_recipes import train_recipe

            return train_recipe(getattr(cfg, "model", None))
        if stage == "calibrate":
            from trtqat.quant.api import CNN_METHOD

            return {"method": CNN_METHOD}
        from trtqat.families.cnn.qat import classifier_recipe

        return classifier_recipe(cfg, dict((source or {}).get("train_args") or {}))

    # ---- stages -------------------------------------------------------------------------
    def run_train(self, cfg: TrainConfig) -> StageResult:
        """FP32 training (``trtqat.stages.train``) of ``self.build(cfg.model)``."""
        from trtqat.families.cnn.fp32 import train_classifier

        return train_classifier(cfg, self)

    def run_calibrate(self, cfg: CalibrateConfig, source: dict[str, Any] | None) -> StageResult:
        """PTQ (``trtqat.stages.calibrate``) of the checkpoint, or of the float ``cfg.model``."""
        from trtqat.families.cnn.ptq import calibrate_classifier

        return calibrate_classifier(cfg, self, source)

    def run_qat(self, cfg: QATConfig, source: dict[str, Any]) -> StageResult:
        """QAT (``trtqat.stages.qat``) of the calibrated checkpoint, with cross-entropy."""
        from trtqat.families.cnn.qat import finetune_classifier

        if getattr(cfg, "distill", None):
            from trtqat.runopts import ConfigError

            raise ConfigError("--distill is for detectors; image classifiers fine-tune with "
                              "cross-entropy: drop --distill")

        return finetune_classifier(cfg, self, source)

    def describe(self, stage: str, result: StageResult) -> str:
        """``STAGE: best val top-1 X%; run folder OUT``."""
        best = result.best
        text = f"{stage}: best val top-1 {best:.2f}%" if best is not None else stage
        return f"{text}; run folder {result.out}"

    # ---- export, compare, sensitivity ---------------------------------------------------
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
        names the dynamic axes (batch, height, width). Names: ``input``/``output`` (tuple
        outputs by position, dict outputs by key) unless the model sets ``input_names``/
        ``output_names`` (an Ultralytics classifier: ``images``/``output0``)."""
        from trtqat.export.onnx_export import make_example_inputs

        size = spec.get("input_size") or spec.get("image_size") or 32
        images = make_example_inputs(size, batch or 2, int(spec.get("channels") or 3))
        axes = tuple(spec.get("dynamic", ("batch",) if batch is None else ()))
        where = {"batch": 0, "height": 2, "width": 3}
        dims = {where[a]: a for a in axes if a in where}
        names, ins = ["output"], ["input"]
        if model is not None:  # several outputs (tuple, list, dict): each exported by name
            import torch

            from trtqat.outputs import flatten

            was = model.training
            with torch.no_grad():
                names = [n for n, _ in flatten(model.eval()(images))]
            model.train(was)
            own = getattr(model, "output_names", None)  # the model's own names (Ultralytics')
            names = list(own) if own and len(own) == len(names) else names
            ins = list(getattr(model, "input_names", None) or ins)[:1]
        return ExportInputs((images,), ins, names,
                            {ins[0]: dims, **{n: {0: "batch"} for n in names if 0 in dims}})

    def export_check(self, variant: str, reference: Sequence[Any], candidate: Sequence[Any],
                     context: CheckContext | None = None) -> list[Check]:
        """Each output within the variant's tolerance (INT8: the noise-floor criterion),
        top-1 agreement on the validation data, the Q/DQ inventory of INT8 files."""
        from trtqat.export.checks import classifier_checks

        return classifier_checks(variant, reference, candidate, context)

    def export_plan(self, model: nn.Module, ckpt: dict[str, Any], options: ExportOptions
                    ) -> FamilyExport:
        """Example images, the validation split, ``--skip-layers`` (see ``image_export``)."""
        from trtqat.families.cnn.export import image_export

        return image_export(self, model, ckpt, options)

    def module_plan(self, model: nn.Module, example_inputs: Any, **options: Any) -> ExportPlan:
        """Example images (or a dict of inputs) as given, batch dynamic unless
        ``dynamic_batch=False`` or ``dynamic_axes`` says otherwise, BatchNorm folded,
        checked against PyTorch as ``trtqat export`` checks a classifier."""
        from trtqat.export.onnx_export import model_plan

        return model_plan(model, example_inputs, checks=self.export_check, **options)

    def compare_data(self, variants: Sequence[Variant], settings: dict[str, Any],
                     cfg: CompareConfig) -> EvalData:
        """Labelled validation images and calibration images of the runs' data."""
        from trtqat.families.cnn.compare_data import image_data

        return image_data(self, variants, settings, cfg)

    def sensitivity_data(self, ckpt: dict[str, Any], cfg: SensitivityConfig, device: Any
                         ) -> tuple[list, dict]:
        """Validation ``(images, labels)`` batches of the checkpoint's data, in memory."""
        from trtqat.families.cnn.sensitivity import image_batches

        return image_batches(ckpt, cfg, device)


def restore(family: ModelFamily, model: nn.Module, ckpt: dict[str, Any],
            quantized: bool) -> nn.Module:
    """``model`` (just built by ``family``) with the checkpoint's quantizers (placed as it
    was calibrated, then made its ``format``; none when not ``quantized``) and weights."""
    from trtqat.families.cnn.model_source import is_quantizer_key
    from trtqat.families.cnn.models import LEGACY
    from trtqat.families.quant_format import apply_spec_format
    from trtqat.quant.placement.place import GRAPH_1
    from trtqat.quant.reparam import reparameterize

    spec = ckpt["model"]
    skip = tuple(spec.get("skip_layers") or ())
    # an FP32 checkpoint to quantize (PTQ) is loaded first: placement re-parameterizes
    # RepVGG-style blocks with its trained BatchNorm statistics
    from_float = quantized and not spec.get("quantized")
    if quantized and not from_float:
        family.quantize(model, skip, placement=placement_of(spec))
        apply_spec_format(model, spec)
    elif spec.get("quantized") and placement_of(spec) not in (GRAPH_1, LEGACY):
        reparameterize(model)  # a quantized checkpoint's weights are re-parameterized ones
    state = ckpt["state_dict"]
    if not quantized:
        state = {k: v for k, v in state.items() if not is_quantizer_key(k)}
    fit_checkpoint_state(model, state, spec)
    if from_float:
        family.quantize(model, skip, placement=placement_of(spec))
        apply_spec_format(model, spec)
    return model


def placement_of(spec: dict[str, Any]) -> str:
    """The Q/DQ placement a checkpoint's quantizers were made with: its ``placement``, or
    the legacy one for quantized checkpoints written before it was recorded."""
    from trtqat.families.cnn.models import LEGACY
    from trtqat.quant.placement import PLACEMENT_VERSION

    if spec.get("placement"):
        return str(spec["placement"])
    return LEGACY if spec.get("quantized") else PLACEMENT_VERSION


def fit_checkpoint_state(model: nn.Module, state: dict[str, Any], spec: dict[str, Any],
                         what: str = "architecture") -> None:
    """Load a checkpoint's ``state`` into ``model`` (strict); a mismatch is one line saying
    the file was saved from another ``what``."""
    from trtqat.families.cnn.model_source import ModelSourceError, fit_state_dict
    from trtqat.runs.checkpoint import CheckpointError

    try:
        fit_state_dict(model, state, f"checkpoint of a {spec['arch']} with "
                       f"{spec['num_classes']} classes")
    except (ModelSourceError, RuntimeError) as exc:
        raise CheckpointError(f"{str(exc).splitlines()[0][:300]}: it was saved from another "
                              f"{what}") from None

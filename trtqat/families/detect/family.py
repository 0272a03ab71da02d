"""Object detectors (YOLO-style, anchor-free): the detection family's hooks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from trtqat.families.base import ExportInputs, ModelFamily, StageData

# `trtqat train` defaults of a detector (the built-in one reaches mAP@.5 >= 0.9 with them)
TRAIN_RECIPE: dict[str, Any] = {"image_size": 96, "batch_size": 32, "epochs": 10, "lr": 0.005,
                                "min_lr": 1e-4, "opt": "adamw", "weight_decay": 5e-4,
                                "momentum": 0.9, "data": "digits"}
CALIB_METHOD = "percentile"


class DetectFamily(ModelFamily):
    """Detectors whose eval output is ``(batch, 4 + classes, anchors)`` (YOLOv8/11 style),
    scored by COCO mAP; the final prediction convs stay in float."""

    name = "detect"
    task = "detection"
    summary = ("object detectors: yolo_digits, detect:path/to/file.py:factory, or an "
               "Ultralytics YOLO .yaml/.pt")
    spec_keys = ("arch", "num_classes")
    score_key = "best_map"
    score_label = "mAP@[.5:.95]"

    # ---- finding the family -------------------------------------------------------------
    def claims_model(self, model: str) -> bool:
        """``yolo_digits``/``detect``, ``detect:FILE.py:FACTORY``, an Ultralytics .yaml/.pt."""
        from trtqat.families.detect.sources import kind_of

        return kind_of(model) is not None

    def claims_module(self, model: nn.Module) -> bool:
        """The built-in detector and Ultralytics models (``trtqat.export_onnx``): detection,
        segmentation, pose, OBB, and classification (exported as Ultralytics exports it,
        checked as a classifier)."""
        from trtqat.families.detect.yolo import YoloDigits
        from trtqat.quant.plugins.ultralytics import head_task

        return isinstance(model, YoloDigits) or head_task(model) is not None

    # ---- models -------------------------------------------------------------------------
    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """The float detector ``--model`` names (see :mod:`.sources`)."""
        from trtqat.families.detect.sources import build

        return build(model, num_classes, options.get("source"))

    def arch(self, model: str) -> str:
        from trtqat.families.detect.sources import arch_name

        return arch_name(model)

    def origin(self, model: str) -> dict[str, Any]:
        from trtqat.families.detect.sources import origin

        return origin(model)

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The detector of a checkpoint, with its weights (quantized when it is, or when
        ``quantized=True``)."""
        from trtqat.families.cnn.family import restore

        spec = ckpt["model"]
        quantized = bool(spec.get("quantized")) if quantized is None else quantized
        source = spec.get("source") or {"model": spec["arch"]}
        return restore(self, self.build(source["model"], int(spec["num_classes"]),
                                        source=source), ckpt, quantized)

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = (),
                 placement: str | None = None) -> nn.Module:
        """TensorRT's Q/DQ placement in place, as ``trtqat.quantize`` places it (layers,
        residual Adds, Concat/MaxPool shared scales; activations histogram-calibrated); the
        final prediction convs (and an Ultralytics head's DFL) and ``skip_layers`` keep
        their float path, also in a model built under ``quant_modules.initialize()``.
        ``placement``: the one a checkpoint was calibrated with (``placement_of(spec)``;
        None: the current one; ``legacy``: layer quantizers only)."""
        from trtqat.families.cnn.models import LEGACY, QUANT_DESC_INPUT, quantize_classifier
        from trtqat.families.detect.sources import float_layers
        from trtqat.quant.config import QuantConfig
        from trtqat.quant.model_ops import disable_layers, quantize

        patterns = (*float_layers(model), *skip_layers)
        if placement != LEGACY:
            quantize_classifier(model, patterns, placement)
            return model
        # detector checkpoints written before the placement was recorded: layers only
        quantize(model, QuantConfig(quant_desc_input=QUANT_DESC_INPUT))
        if patterns:
            disable_layers(model, patterns)
        return model

    # ---- data and recipe ----------------------------------------------------------------
    def data(self, cfg: Any, split: str, **context: Any) -> StageData:
        """Detection batches ``(images, [targets])``: ``context`` holds ``data``,
        ``image_size`` and ``batch_size``. "train": shuffled training batches and the
        validation ones; "calib": the same (eval: nothing is augmented either way).
        ``info["classes"]``: the class names. ``cfg.strict`` (``--strict``): skippable data
        defects are errors."""
        from trtqat.families.detect.data import datasets, loader

        if split not in ("train", "calib"):
            raise ValueError(f"unknown split {split!r}: use train or calib")
        train, val, classes = datasets(context.get("data"), context["image_size"],
                                       strict=bool(getattr(cfg, "strict", False)))
        batch = int(context["batch_size"])
        workers = getattr(cfg, "workers", 0) or 0
        return StageData(loader(train, batch, True, getattr(cfg, "seed", 0), workers),
                         loader(val, batch, False, workers=workers), len(classes),
                         {"classes": list(classes)})

    def recipe(self, stage: str, cfg: Any, source: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """train: :data:`TRAIN_RECIPE`; calibrate: :data:`CALIB_METHOD` at the FP32 run's
        size; qat: TensorRT's guidance from the FP32 run (see ``runs.qat_recipe``)."""
        if stage == "train":
            return dict(TRAIN_RECIPE)
        if stage == "calibrate":
            return {"method": CALIB_METHOD, "image_size": TRAIN_RECIPE["image_size"],
                    "batch_size": TRAIN_RECIPE["batch_size"]}
        from trtqat.families.detect.runs import qat_recipe

        return qat_recipe(cfg, source or {"model": {}}, TRAIN_RECIPE)

    # ---- stages -------------------------------------------------------------------------
    def run_train(self, cfg: Any) -> dict[str, Any]:
        from trtqat.families.detect.runs import train_detector

        return train_detector(cfg, self)

    def run_calibrate(self, cfg: Any, source: dict[str, Any] | None) -> dict[str, Any]:
        from trtqat.families.detect.runs import calibrate_detector

        return calibrate_detector(cfg, self, source)

    def run_qat(self, cfg: Any, source: dict[str, Any]) -> dict[str, Any]:
        from trtqat.families.detect.runs import qat_detector

        return qat_detector(cfg, self, source)

    def describe(self, stage: str, result: Any) -> str:
        """``STAGE: best val mAP@[.5:.95] X (last mAP@.5 Y); run folder OUT``."""
        text = stage
        if result.best is not None:
            text = f"{stage}: best val mAP@[.5:.95] {result.best:.2f}"
            if (result.last or {}).get("val_map50") is not None:
                text += f" (last mAP@.5 {result.last['val_map50']:.2f})"
            if result.before is not None:
                text += f", from {result.before:.2f}"
        return f"{text}; run folder {result.out}"

    # ---- export, compare, sensitivity ---------------------------------------------------
    def metric(self, outputs: Any, targets: Any, head: Any = None) -> dict[str, float]:
        """COCO ``map`` (mAP@[.5:.95]) and ``map50`` in percent, from raw outputs and
        per-image targets; ``head`` (:class:`.heads.Head`, what compare's data records): its
        box and class channels alone (box mAP of a segment, pose or OBB head)."""
        from trtqat.families.detect.heads import detections
        from trtqat.families.detect.metrics import detection_metric

        return detection_metric(outputs if head is None else detections(outputs, head),
                                targets)

    def export_inputs(self, model: nn.Module, spec: dict[str, Any], batch: int | None
                      ) -> ExportInputs:
        """Random images of the checkpoint's size; names ``images``/``output0`` unless the
        model says otherwise; the batch dynamic unless ``batch`` fixes it."""
        from trtqat.export.onnx_export import make_example_inputs
        from trtqat.families.detect.sources import io_names

        images = make_example_inputs(spec.get("image_size") or 96, batch or 2, 3).sigmoid()
        ins, outs = io_names(model)
        axes = {} if batch else {ins[0]: {0: "batch"}, outs[0]: {0: "batch"}}
        return ExportInputs((images,), ins, outs, axes)

    def stamp_plan(self, plan: Any) -> Any:
        """The family's metadata, and ``trtqat.task=detection``: engine builders then check
        a re-encoding by detection agreement (``trtqat.engines.detect_agreement``); an
        Ultralytics classifier's file is a classifier's."""
        import dataclasses

        plan = super().stamp_plan(plan)
        if plan.metadata.get("trtqat.head") == "classify":
            return plan
        return dataclasses.replace(plan, metadata={**plan.metadata,
                                                   "trtqat.task": "detection"})

    def export_check(self, variant: str, reference: Sequence[Any], candidate: Sequence[Any],
                     context: Any = None) -> list[Any]:
        """Boxes (pixels) and scores each on their own scale (see ``export.detection_checks``)."""
        from trtqat.families.detect.export import detection_checks

        return detection_checks(variant, reference, candidate, context)

    def module_plan(self, model: nn.Module, example_inputs: Any, **options: Any) -> Any:
        """As ``trtqat export`` exports a detector: ``images``/``output0`` (and ``output1``,
        a segmentation head's protos: Ultralytics' names), the layers whose quantizers are
        disabled (the float head) marked as float on purpose, the check of what each part
        of the head's outputs means. An Ultralytics head is put in export mode (as
        Ultralytics' exporter does), so the file holds its export outputs alone."""
        from trtqat.export.onnx_export import model_plan
        from trtqat.families.detect.export import head_plan
        from trtqat.families.detect.sources import io_names
        from trtqat.families.detect.ultralytics import anchors_follow_input

        anchors_follow_input(model)  # a batch seen in calibration must not fix the file's
        plan = model_plan(model, example_inputs, **options)
        plan.input_names, plan.output_names = io_names(model)
        return head_plan(plan, model)

    def export_plan(self, model: nn.Module, ckpt: dict[str, Any], options: Any) -> Any:
        from trtqat.families.detect.export import detector_export

        return detector_export(self, model, ckpt, options)

    def compare_data(self, variants: Sequence[Any], settings: dict[str, Any], cfg: Any) -> Any:
        from trtqat.families.detect.compare_data import detection_data

        return detection_data(self, variants, settings, cfg)

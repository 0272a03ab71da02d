"""Model families behind one interface (:class:`ModelFamily`), found by name in a registry.

``of_model("minilm")``, ``of_checkpoint(ckpt)`` and ``get("cnn")`` return the family object;
stage code calls its hooks and never tests a family name itself.
"""

from __future__ import annotations

import dataclasses
import importlib
from functools import cache
from typing import Any

from trtqat.errors import TrtqatError
from trtqat.families.base import (
    FAMILY_KEY,
    EngineHints,
    ExportInputs,
    ModelFamily,
    StageData,
    StageResult,
    UnsupportedStageError,
)
from trtqat.families.registry import FAMILIES
from trtqat.runs import checkpoint as _checkpoint


class UnknownFamilyError(TrtqatError, ValueError):
    """No registered family has the given name."""


@cache
def get(name: str) -> ModelFamily:
    """The registered family called ``name``."""
    for key, target in FAMILIES:
        if key == name:
            module, cls = target.split(":")
            return getattr(importlib.import_module(module), cls)()
    raise UnknownFamilyError(f"unknown model family {name!r}: use one of {', '.join(names())}")


def names() -> list[str]:
    """Registered family names, in claiming order."""
    return [key for key, _ in FAMILIES]


def all_families() -> list[ModelFamily]:
    """Every registered family, in claiming order."""
    return [get(key) for key in names()]


class UnknownModelError(TrtqatError, ValueError):
    """``--model`` is a path that no family builds a model from."""


def calibration_defaults() -> list[tuple[str, str]]:
    """``(family summary, its default --method)`` of every family that calibrates, as its
    ``recipe("calibrate", ...)`` states it (what ``trtqat calibrate``'s help shows)."""
    import types

    blank = types.SimpleNamespace(method=None, batch_size=None, max_length=None, model=None,
                                  image_size=None, percentile=None)
    out = []
    for family in all_families():
        try:
            method = family.recipe("calibrate", blank).get("method")
        except UnsupportedStageError:
            continue
        if method:
            out.append((family.summary.split(":")[0], str(method)))
    return out


def of_model(model: str) -> ModelFamily:
    """The family of ``--model MODEL``: the first that claims it (CNN takes every other
    name). A path none claims is :class:`UnknownModelError`, one line listing what each
    family takes."""
    for family in all_families():
        if family.claims_model(model):
            return family
    from trtqat.families.model_paths import unclaimed_reason

    forms = "; ".join(f.summary for f in all_families())
    raise UnknownModelError(f"--model {model[:300]}: {unclaimed_reason(model)}; --model takes "
                            f"{forms}")


def of_checkpoint(ckpt: dict[str, Any]) -> ModelFamily:
    """The family of a loaded checkpoint (its ``model.family`` tag; CNN when untagged)."""
    for family in all_families():
        if family.claims_checkpoint(ckpt):
            return family
    return get("cnn")


def of_module(model: Any) -> ModelFamily:
    """The family of an in-memory model (the first that claims it; CNN is the fallback)."""
    for family in all_families():
        if family.claims_module(model):
            return family
    return get("cnn")


def of_source(checkpoint: str | None, model: str | None = None
              ) -> tuple[ModelFamily, dict[str, Any] | None]:
    """The family of a stage's input and the loaded checkpoint: ``--checkpoint`` when given
    (its tag), else ``--model`` (no checkpoint: None)."""
    if checkpoint:
        from trtqat.runs.checkpoint import load_checkpoint

        ckpt = load_checkpoint(checkpoint)
        return of_checkpoint(ckpt), ckpt
    return of_model(model or ""), None


def build_from_checkpoint(ckpt: dict[str, Any], quantized: bool | None = None) -> Any:
    """Rebuild the model a checkpoint describes and load its weights, whatever its family
    (``of_checkpoint(ckpt).load``).

    ``quantized=None`` builds what the checkpoint holds; ``True`` on an FP32 checkpoint gives
    an uncalibrated quantized model with the FP32 weights (the start of PTQ); ``False`` on a
    quantized one gives its weights in float.
    """
    return of_checkpoint(ckpt).load(ckpt, quantized)


def summarized(family: ModelFamily, stage: str, result: StageResult) -> StageResult:
    """``result`` of ``stage`` with its :attr:`~StageResult.summary`: the family's closing
    line (for calibrate, labelled with the amax method the run used)."""
    result = dataclasses.replace(StageResult.of(stage, result), stage=stage)
    method = (result.last or {}).get("method")
    label = f"{stage} ({method})" if stage == "calibrate" and method else stage
    return dataclasses.replace(result, summary=family.describe(label, result))


def of_onnx(model: Any) -> ModelFamily:
    """The family of an ONNX model (``onnx.ModelProto``): its ``trtqat.family`` metadata,
    else the first family that claims its input names (files from elsewhere); CNN last."""
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get(FAMILY_KEY) in names():
        return get(meta[FAMILY_KEY])
    inputs = [i.name for i in model.graph.input]
    for family in all_families():
        if family.claims_onnx(inputs):
            return family
    return get("cnn")


# the checkpoint loader checks each family's required "model" keys
_checkpoint.register_spec_keys(lambda ckpt: of_checkpoint(ckpt).spec_keys)

__all__ = ["FAMILY_KEY", "EngineHints", "ExportInputs", "ModelFamily", "StageData",
           "StageResult", "UnknownFamilyError", "UnknownModelError", "UnsupportedStageError",
           "all_families", "build_from_checkpoint", "get", "names", "of_checkpoint",
           "of_model", "of_module", "of_onnx", "of_source", "summarized"]

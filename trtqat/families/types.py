"""The typed values that pass between the stages and the family hooks
(:class:`trtqat.families.base.ModelFamily`): what a hook is given and what it returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.errors import TrtqatError
from trtqat.variants import canonical

# Display order of the report.
ORDER = ("fp32", "fp16", "ptq-max", "ptq-percentile-99.9", "ptq-percentile-99.99", "ptq-mse",
         "ptq-entropy", "qat-int8", "qat-int8-fp16")
FORMAT_ORDER = ("int8", "fp8", "int4")  # the report's blocks after FP32/FP16: one per format


class CompareError(TrtqatError, RuntimeError):
    """A comparison cannot start (no checkpoints, too little data, ...)."""


class SensitivityError(TrtqatError, ValueError):
    """The sensitivity analysis cannot run as asked (bad option, unquantized checkpoint)."""


@dataclass
class Variant:
    """One engine to build and measure."""

    name: str  # e.g. "ptq-entropy"
    precision: str  # a variant of the table: fp32 | fp16 | int8 | int8-fp16
    export_variant: str | None  # the same, exported (None: an explicit ONNX)
    checkpoint: Path | None = None
    onnx: Path | None = None
    stage: str = ""
    arch: str = "model"
    family: str = "cnn"  # the registered family name (its metric scores the variant)
    tag: str = ""  # the checkpoint part of the file name (trtqat.variants.stage_tag)

    def __post_init__(self) -> None:
        self.precision = canonical(self.precision)  # int8+fp16 is still accepted

    @property
    def format(self) -> str | None:
        """The quantized format of the variant (``trtqat.variants``' column; None: float)."""
        from trtqat.variants import BY_NAME

        row = BY_NAME.get(self.precision)
        return row.format if row is not None else None

    def sort_key(self) -> tuple[int, int, str]:
        """FP32, FP16, then each format's PTQ rows and QAT rows (INT8's in :data:`ORDER`)."""
        fmt = self.format
        block = 0 if fmt is None else 1 + (FORMAT_ORDER.index(fmt) if fmt in FORMAT_ORDER
                                           else len(FORMAT_ORDER))
        base = self.name  # the INT8 row's name: ORDER holds the rows of one format
        if fmt not in (None, "int8"):
            base = base.replace(f"qat-{fmt}", "qat-int8").replace(f"-{fmt}", "")
        return (block, ORDER.index(base) if base in ORDER else len(ORDER), self.name)


@dataclass
class ExportInputs:
    """What export needs: example inputs, ONNX input/output names, dynamic axes."""

    example: tuple[Any, ...]                 # positional inputs of model.forward
    input_names: list[str]
    output_names: list[str]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)


@dataclass
class StageData:
    """What :meth:`ModelFamily.data` gives a stage: ``train`` (training or calibration
    batches; sentences for encoders), ``val`` (held-out data, None when the data has no
    labels) and what the data says about itself (``classes``, ``info``)."""

    train: Any
    val: Any | None = None
    classes: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class FamilyExport:
    """What a family's ``export_plan`` returns besides the plan itself."""

    plan: Any                           # trtqat.export.onnx_export.ExportPlan
    arch: str                           # the model part of file names
    shape: str                          # printed after each file: "dynamic batch", ...
    batch: int | None = None            # a fixed batch: file names end in -b<N>
    io_dtype: str = "float32"
    metadata: dict[str, str] = field(default_factory=dict)  # every file's
    info: dict[str, Any] = field(default_factory=dict)      # added to export.json
    # after each checked file: (path, ExportResult) -> lines to print (e.g. a companion file)
    post: Callable[[Path, Any], list[str]] | None = None


Feed = dict[str, np.ndarray] | np.ndarray  # by input name, or the one input's array


@dataclass
class EvalData:
    """Inputs and targets of the accuracy (or fidelity) measurement, and what else the
    stages need: calibration feeds, timing feeds, engine shapes, the export of a variant."""

    batches: list[Feed]                      # scored, in order
    targets: np.ndarray                      # labels, or FP32 reference outputs
    calib: list[Feed]                        # ORT int8 re-encoding calibration
    timing: Callable[[int], Feed]            # the timing feed of one batch size
    dims: tuple[tuple[int, ...], tuple[int, ...]]  # input shape after the batch: min, opt
    metric: str                              # the report's headline metric
    export: Callable[[Variant, Path, bool], None]  # (variant, onnx path, validate)
    info: dict[str, Any] = field(default_factory=dict)
    output: str | None = None                # the output scored (None: the first)
    metric_args: dict[str, Any] = field(default_factory=dict)  # family.metric(..., **these)




class MappingView(Mapping[str, Any]):
    """Read-only ``result["key"]`` access to a typed result: the keys of the dict that
    :meth:`_view` builds (what earlier versions returned)."""

    def _view(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self._view()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())


@dataclass
class StageResult(MappingView):
    """What a training stage (train, calibrate, qat) returns: the family's ``run_*`` hook
    fills it, the stage verb adds the :attr:`summary` line.

    ``best`` is the stage's headline ``metric``: the best validation top-1 in percent of an
    image classifier (None without labelled data), the held-out mean cosine against FP32 of
    an encoder; ``before`` the same before the stage ran (QAT: the calibrated model's).
    ``details`` holds what a family adds (encoders: ``fidelity``, ``start``, ``fp32``).

    Read-only mapping access (``result["last"]``, ``result["best_top1"]``, ``result["out"]``,
    and the keys of ``details``) keeps the dicts of earlier versions working.
    """

    stage: str                        # "train" | "calibrate" | "qat"
    out: str                          # the run folder
    last: dict[str, Any]              # the last metrics record (metrics.jsonl)
    best: float | None = None
    before: float | None = None
    metric: str = "top1"
    summary: str = ""                 # the command's closing line
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, stage: str, result: Mapping[str, Any]) -> StageResult:
        """``result`` as a StageResult: itself, or the dict of a family written for earlier
        versions (``out``, ``last``, ``best_top1``, ``start_top1``, anything else)."""
        if isinstance(result, StageResult):
            return result
        rest = {k: v for k, v in result.items()
                if k not in ("out", "last", "best_top1", "start_top1", "summary")}
        best = result.get("best_top1")
        return cls(stage, str(result.get("out") or ""), dict(result.get("last") or {}),
                   best=None if best is None or best < 0 else float(best),
                   before=result.get("start_top1"), details=rest)

    def _view(self) -> dict[str, Any]:
        """The dict earlier versions returned."""
        out: dict[str, Any] = {"last": self.last, "out": self.out}
        if self.metric == "top1":
            out["best_top1"] = -1.0 if self.best is None else self.best
            if self.stage == "qat":
                out["start_top1"] = self.before
        out.update(self.details)
        if self.summary:
            out["summary"] = self.summary
        return out

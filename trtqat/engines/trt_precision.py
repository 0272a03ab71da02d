"""Which TensorRT builder precision flags to set: from the options and from the file.

What the TensorRT versions want (and where it is written):

* TensorRT 11 has no precision builder flags (``FP16``, ``INT8``, ``BF16``, ``FP8``, ``INT4``,
  ``FP4`` are gone) and every network is strongly typed: precision comes from the file
  (Q/DQ types, FP16 tensors), so nothing is set. Source: the TensorRT 11 Python API list
  and the 10.x -> 11.x migration notes (docs/TENSORRT.md in the shared reference).
* TensorRT 10, weakly typed (its default): an explicitly quantized network may use a
  quantized type only when its builder flag is on, so a file with FP8 Q/DQ gets
  ``BuilderFlag.FP8`` and a file with INT4 block weights ``BuilderFlag.INT4``; INT4 is
  weight-only ("TensorRT quantizes activations and weights for INT8, FP8, and FP4.
  Weight-only quantization is supported for INT4", TensorRT 10 developer guide, "Working
  with Quantized Types"), its GEMM runs in FP16/BF16, so ``FP16`` is set too. Strong
  typing is therefore not needed for FP8 or INT4 files in 10 and stays the user's choice
  (``--stronglyTyped``), as in trtexec 10.
* trtexec 10 refuses FP8 with INT8 ("Invalid usage, fp8 and int8 aren't allowed to be
  enabled together", samples/common/sampleOptions.cpp), so a file holding both INT8 and
  FP8 Q/DQ is built strongly typed (its types are explicit), and ``--fp8`` with
  ``--int8``/``--best`` is refused in one line. ``--best`` with ``--stronglyTyped`` is
  refused as trtexec refuses it.
* TensorRT 10, strongly typed: a precision flag is an API usage error
  ("Parameter check failed, condition: !config.getFlag(BuilderFlag::kFP16)",
  NVIDIA/TensorRT#4253); trtexec drops them with a warning, and so does this.

Flags are looked up by name under ``hasattr`` guards, never by enum value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtqat.engines.errors import EngineBuildError, OptionsError
from trtqat.engines.specs import PRECISION_FLAGS, BuildOptions, precision_note
from trtqat.engines.trt_lib import trt_major

_FLAG_NAMES = {"fp16": "FP16", "int8": "INT8", "fp8": "FP8", "int4": "INT4"}
# the TensorRT 10 flags a file's formats need (weight-only INT4 runs its GEMM in FP16)
_FORMAT_FLAGS = {"fp8": ("fp8",), "int4": ("int4", "fp16")}
_FORMAT_TITLE = {"fp8": "FP8 Q/DQ", "int4": "INT4 block weights"}


@dataclass
class PrecisionPlan:
    """What to set: builder flag names, strong typing, the options left unapplied (as
    BuildOptions field names) and the lines to log."""

    flags: tuple[str, ...] = ()
    strongly_typed: bool = False
    ignored: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)


def requested_flags(options: BuildOptions) -> set[str]:
    """The precisions the options ask for (``--best``: FP16 + INT8, as in trtexec 10)."""
    wanted = {f for f in _FLAG_NAMES if getattr(options, f)}
    if options.best:
        wanted |= {"fp16", "int8"}
    return wanted


def _given(options: BuildOptions) -> tuple[str, ...]:
    return tuple(f for f in PRECISION_FLAGS if getattr(options, f))


def plan_precision(trt: Any, options: BuildOptions, formats: tuple[str, ...],
                   path: Path | str) -> PrecisionPlan:
    """The :class:`PrecisionPlan` for a file holding ``formats`` (int8/fp8/int4) on the
    running TensorRT ``trt``; a format this TensorRT cannot build, or flags that cannot go
    together, is one line (EngineBuildError / OptionsError)."""
    version = f"TensorRT {trt.__version__}"
    if trt_major(trt) >= 11:
        given = _given(options)
        if given and set(given) <= set(formats) & {"fp8", "int4"}:  # the file has them already
            return PrecisionPlan(ignored=given, infos=[
                f"{' '.join('--' + f for f in given)}: {version} takes precision from the ONNX "
                "graph, which holds it already; nothing to set"])
        note = precision_note(options, version)
        return PrecisionPlan(ignored=given, warnings=[note] if note else [])
    for fmt in ("fp8", "int4"):
        if fmt in formats and not hasattr(trt.BuilderFlag, _FLAG_NAMES[fmt]):
            raise EngineBuildError(
                f"{path} holds {_FORMAT_TITLE[fmt]}, which {version} cannot build (it has no "
                f"BuilderFlag.{_FLAG_NAMES[fmt]}): build it with TensorRT 10 or newer"
                f"{' on an FP8 GPU (Ada, Hopper or newer)' if fmt == 'fp8' else ''}, or "
                "export the model with 'trtqat export --variant int8'")
    if options.best and options.strongly_typed:
        raise OptionsError("--best and --stronglyTyped cannot be both set: --best lets TensorRT "
                           "pick precisions, --stronglyTyped takes them from the ONNX; drop one")
    wanted = requested_flags(options)
    auto = {flag for fmt in formats for flag in _FORMAT_FLAGS.get(fmt, ())}
    plan = PrecisionPlan(strongly_typed=options.strongly_typed)
    if not plan.strongly_typed and {"int8", "fp8"} <= set(formats):
        plan.strongly_typed = True
        plan.infos.append(f"{path} holds INT8 and FP8 Q/DQ; TensorRT 10 cannot enable both "
                          "precision flags, so the network is built strongly typed (precision "
                          "from the file)")
    if not plan.strongly_typed and "int8" in wanted and "fp8" in wanted | auto:
        why = "--fp8" if "fp8" in wanted else f"{path} holds FP8 Q/DQ, which needs FP8"
        raise OptionsError(f"{why} and INT8 (--int8 or --best) cannot be enabled together in "
                           f"{version} (trtexec refuses them too): drop --int8/--best (use "
                           "--fp16 for FP16 fallback), or pass --stronglyTyped")
    if plan.strongly_typed:
        given = _given(options)
        if given:
            plan.warnings.append(f"{' '.join('--' + f for f in given)}: precision flags are not "
                                 "allowed in a strongly typed network (precision comes from the "
                                 "ONNX); ignored")
        plan.ignored = given
        return plan
    missing = sorted(f for f in wanted if not hasattr(trt.BuilderFlag, _FLAG_NAMES[f]))
    plan.flags = tuple(f for f in _FLAG_NAMES if f in wanted | auto and f not in missing)
    for fmt in formats:
        if fmt in _FORMAT_FLAGS:
            set_now = [_FLAG_NAMES[f] for f in _FORMAT_FLAGS[fmt]]
            plan.infos.append(f"{path} holds {_FORMAT_TITLE[fmt]}: BuilderFlag "
                              f"{'+'.join(set_now)} set")
    if missing:
        plan.warnings.append(f"{' '.join('--' + f for f in missing)}: {version} has no such "
                             "builder flag; ignored")
        plan.ignored = tuple(f for f in _given(options) if f in missing
                             or f == "best" and set(missing) & {"fp16", "int8"})
    return plan


def apply_plan(trt: Any, config: Any, plan: PrecisionPlan) -> None:
    """Set ``plan.flags`` on the builder config; each flag by name under its own guard (only
    TensorRT 10 has them, and enum values differ by version)."""
    flags = set(plan.flags)
    if "fp16" in flags and hasattr(trt.BuilderFlag, "FP16"):
        config.set_flag(trt.BuilderFlag.FP16)
    if "int8" in flags and hasattr(trt.BuilderFlag, "INT8"):
        config.set_flag(trt.BuilderFlag.INT8)
    if "fp8" in flags and hasattr(trt.BuilderFlag, "FP8"):
        config.set_flag(trt.BuilderFlag.FP8)
    if "int4" in flags and hasattr(trt.BuilderFlag, "INT4"):
        config.set_flag(trt.BuilderFlag.INT4)

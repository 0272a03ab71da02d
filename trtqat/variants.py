"""The ONNX variants, in one table: name, precision, opset, tolerances, and the file names.

Pure Python (the CLI reads it at start-up, before onnx or the exporter are imported).

Adding a variant is one row of :data:`TABLE`: ``trtqat export --variant`` choices, the
export checks, ``compare`` and the file names all read it.

Tolerances (measured where the row says so; see :mod:`trtqat.export.validate` and
:mod:`trtqat.export.criterion`):

* ``rel_tol`` (float variants): ``max|ORT - PyTorch| / max|PyTorch|`` of each output; fp32
  may also reach 4x PyTorch's own float32 error (the model rerun in float64 on the same
  inputs), measured when the fixed tolerance fails: float32 rounding grows with the
  output's magnitude and the model's depth.
* ``mean_limit`` (INT8 variants): ``(margin, minimum)``: the mean difference against the
  PyTorch fake-quant model may reach ``margin`` x the measured noise floor and never less
  than ``minimum`` quantization steps; fp16 re-rounds every activation, so int8-fp16 gets
  more room.
* fp16 and int8-fp16 classifier outputs may also drift twice as far as PyTorch's own float16
  run of the model, and flip top-1 twice as often, measured when the limits above fail
  (:func:`trtqat.export.criterion.half_floor`; deep untrained models need it).
* ``min_mean_cosine`` / ``min_cosine`` (embedding outputs): the mean over sentences and the
  lowest sentence's cosine of ORT's embeddings with PyTorch's. fp32 and fp16 are the same
  arithmetic (measured 1 - 1e-7); int8 measured mean >= 0.9996 on all-MiniLM-L6-v2 PTQ,
  lowest sentence 0.9967 (a last-bit difference can flip a code and some sentences amplify
  it); int8-fp16 measured mean 0.974 to 0.996, lowest 0.956 (fp16 arithmetic before each
  QuantizeLinear flips many codes).
* int4 and int4-fp16 (weight-only): the file dequantizes exactly the PyTorch model's
  fake-quantized weights, so they are checked as fp32 and fp16 are; measured on
  all-MiniLM-L6-v2 block 32 (benchmarks/int4_minilm.py): see the README's int4 section.
* fp8 and fp8-fp16 (E4M3 Q/DQ): the INT8 rows' ``mean_limit``, measured to hold
  (``benchmarks/fp8_export.py``: digits-trained ResNet18, MobileNetV2 and vit_tiny pass
  with top-1 agreement 100%, 99.7%, 100% in fp8). MiniLM fp8 (max PTQ, 64 held-out
  sentences) measured cosine mean 0.99900, lowest sentence 0.99818: exactly PyTorch's own
  float64-vs-float32 difference of the same model (0.99895), as E4M3's codes are dense
  near zero and more of them sit on a rounding tie than INT8's; so ``min_mean_cosine``
  0.998, ``min_cosine`` 0.99. fp8-fp16 measured mean 0.9976, lowest 0.9965 and keeps
  int8-fp16's limits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MIN_OPSET = 13  # per-channel Q/DQ
DEFAULT_OPSET = 17  # when no opset is asked for (raised to a variant's min_opset)


@dataclass(frozen=True)
class OnnxVariant:
    """One row of the variants table."""

    name: str                     # --variant, file names, compare's precision column
    precision: str                # what the file computes in (help texts)
    int8: bool                    # Q/DQ from calibrated quantizers
    fp16: bool                    # float tensors converted to fp16
    min_opset: int                # lower opsets are raised to this
    rel_tol: float | None         # float variants: max relative output difference
    mean_limit: tuple[float, float] | None  # INT8: (x noise floor, minimum steps)
    min_mean_cosine: float        # embeddings: mean cosine with PyTorch
    min_cosine: float             # embeddings: every sentence's cosine
    format: str | None = None     # quantized format (trtqat.formats): int8, fp8, int4; None float

    @property
    def quantized(self) -> bool:
        """True for the variants exported from calibrated quantizers (any format)."""
        return self.format is not None

    @property
    def qdq(self) -> bool:
        """True for the variants with Q/DQ on activations and weights (int8, fp8): checked by
        the noise-floor criterion and the Q/DQ inventory."""
        return self.format in ("int8", "fp8")


TABLE: tuple[OnnxVariant, ...] = (
    OnnxVariant("fp32", "float32", False, False, MIN_OPSET, 1e-4, None, 0.999, 0.999),
    OnnxVariant("fp16", "float16", False, True, MIN_OPSET, 1e-2, None, 0.99, 0.99),
    OnnxVariant("int8", "int8 Q/DQ, float32 elsewhere", True, False, MIN_OPSET, None,
                (8.0, 1.0), 0.999, 0.98, "int8"),
    OnnxVariant("int8-fp16", "int8 Q/DQ, float16 elsewhere (fp16 scales: opset 19)", True,
                True, 19, None, (16.0, 2.0), 0.965, 0.94, "int8"),
    OnnxVariant("fp8", "fp8 E4M3 Q/DQ, float32 elsewhere (opset 19)", False, False, 19, None,
                (8.0, 1.0), 0.998, 0.99, "fp8"),
    OnnxVariant("fp8-fp16", "fp8 E4M3 Q/DQ, float16 elsewhere (opset 19)", False, True, 19,
                None, (16.0, 2.0), 0.965, 0.94, "fp8"),
    # int4: the file's weights are the PyTorch model's bit for bit (code x scale), activations
    # float: the fp32/fp16 checks apply (relative difference, cosine), see the notes above
    OnnxVariant("int4", "int4 block-wise weights, float32 activations (W4A32, opset 21)", False,
                False, 21, 1e-4, None, 0.999, 0.999, "int4"),
    OnnxVariant("int4-fp16", "int4 block-wise weights, float16 activations (W4A16, opset 21)",
                False, True, 21, 1e-2, None, 0.99, 0.99, "int4"),
)
BY_NAME = {v.name: v for v in TABLE}
ALIASES = {"int8+fp16": "int8-fp16"}  # older spelling of the mixed variant, still accepted

VARIANTS = tuple(v.name for v in TABLE)
"""Every variant, in table order (``--variant all`` exports those of one format)."""
INT8_VARIANTS = tuple(v.name for v in TABLE if v.int8)
FP16_VARIANTS = tuple(v.name for v in TABLE if v.fp16)
CHOICES = (*VARIANTS, "all")
"""``trtqat export --variant`` choices."""


def canonical(name: str) -> str:
    """The table's name for ``name`` (``int8+fp16`` -> ``int8-fp16``); unknown names pass."""
    return ALIASES.get(name, name)


def variant(name: str) -> OnnxVariant:
    """The row of ``name`` (aliases accepted); ValueError for an unknown one."""
    row = BY_NAME.get(canonical(name))
    if row is None:
        raise ValueError(f"unknown variant {name!r}; use one of {', '.join(VARIANTS)}")
    return row


def variants_for(fmt: str = "int8") -> tuple[str, ...]:
    """The float variants and those of quantized format ``fmt``, in table order."""
    return tuple(v.name for v in TABLE if v.format in (None, fmt))


def expand_variants(name: str, fmt: str = "int8") -> tuple[str, ...]:
    """``all`` -> the float variants and those of format ``fmt``; one name -> itself
    (checked)."""
    if name == "all":
        return variants_for(fmt)
    if canonical(name) not in BY_NAME:
        raise ValueError(f"unknown variant {name!r}; use one of {', '.join(VARIANTS)} or all")
    return (canonical(name),)


# ------------------------------------------------------------------ file names
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+]+")


def safe_part(text: object, limit: int = 80) -> str:
    """``text`` as one safe file-name part: only letters, digits, ``_ . +`` (each run of
    anything else, ``/`` and ``-`` included, becomes ``_``), no leading dot, at most
    ``limit`` characters, never empty. Names read from checkpoints and ONNX metadata go
    through it, so none can reach outside the output folder."""
    part = _UNSAFE.sub("_", str(text)).lstrip(".")[:limit]
    return part or "_"


def ptq_tag(calib: dict[str, Any]) -> str:
    """``ptq-<method>`` of a PTQ checkpoint's ``calib`` (``ptq-percentile-99.99``); every
    part made file-name safe (:func:`safe_part`)."""
    method = safe_part(calib.get("method", "max"))
    if method == "percentile":
        value = calib.get("percentile", 99.99)
        try:
            text = f"{float(value):g}"
        except (TypeError, ValueError):
            text = str(value)
        return f"ptq-{method}-{safe_part(text)}"
    return f"ptq-{method}"


def stage_tag(ckpt: dict[str, Any]) -> str:
    """The checkpoint part of file names: ``""`` (FP32), ``ptq-<method>`` or ``qat``."""
    stage = str(ckpt.get("stage", "fp32"))
    if stage == "ptq":
        return ptq_tag(ckpt.get("calib") or {})
    return "" if stage == "fp32" else safe_part(stage)


def arch_label(arch: str) -> str:
    """The model's short name: the last part of a folder path (``/m/tiny-bert`` -> ``tiny-bert``)."""
    return re.split(r"[\\/]+", str(arch).rstrip("/\\"))[-1] or "model"


def artifact_name(arch: str, tag: str, name: str, batch: int | None = None) -> str:
    """The one file-naming rule: ``<arch>[-<tag>]-<variant>[-b<N>].onnx``.

    ``tag`` is :func:`stage_tag` of the checkpoint (``""``/``fp32`` for an FP32-trained
    model, ``ptq-entropy``, ``qat``), e.g. ``resnet18-ptq-entropy-int8.onnx``,
    ``resnet18-qat-int8-fp16.onnx``, ``resnet18-fp16.onnx``; a fixed batch adds ``-b<N>``.
    """
    row = variant(name)
    parts = [safe_part(arch_label(arch))]
    if tag not in ("", "fp32"):
        parts.append("-".join(safe_part(t) for t in str(tag).split("-")))
    parts.append(row.name)
    if batch is not None:
        parts.append(f"b{batch}")
    return "-".join(parts) + ".onnx"

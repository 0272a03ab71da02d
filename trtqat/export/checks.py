"""The two export criteria a family picks from: classifier outputs and embeddings.

* :func:`classifier_checks`: every output against PyTorch (relative error for float
  variants, the noise-floor criterion of :mod:`trtqat.export.criterion` for INT8 and FP8),
  top-1 agreement on the validation data, and the Q/DQ inventory of INT8 and FP8 files.
* :func:`embedding_checks`: the cosine of ONNX Runtime's embeddings with PyTorch's: the mean
  over sentences must reach the variants table's ``min_mean_cosine`` and every sentence its
  ``min_cosine`` (so one broken row, e.g. a padded one, cannot hide behind the mean).

Both take ``(variant, reference, candidate, context)``: the PyTorch and ONNX Runtime
outputs of each validation batch (lists of arrays, valid rows only) and a
:class:`CheckContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from torch import nn

from trtqat.arrays import row_cosines
from trtqat.export import validate as val
from trtqat.variants import TABLE
from trtqat.variants import variant as variant_row

MIN_MEAN_COSINE = {v.name: v.min_mean_cosine for v in TABLE}
MIN_COSINE = {v.name: v.min_cosine for v in TABLE}  # every sentence
FP32_MAX_ABS = 1e-4  # fp32 embeddings (unit vectors when normalized) also match elementwise

Outputs = Sequence[Sequence[np.ndarray]]  # per validation batch, one array per output


@dataclass
class CheckContext:
    """What a check may need besides the outputs."""

    names: list[str]                                   # the file's output names
    batches: list[tuple[torch.Tensor, ...]] = field(default_factory=list)  # inputs, per batch
    counted: list[bool] = field(default_factory=list)  # per batch: counts for top-1
    noise_floor: Callable[[], list | None] = lambda: None  # INT8: measured once, on demand
    half_floor: Callable[[], list | None] = lambda: None   # fp16: PyTorch's float16 drift
    traced: nn.Module | None = None                    # the exported reference (Q/DQ check)
    onnx_path: str = ""


def classifier_checks(variant: str, reference: Outputs, candidate: Outputs,
                      context: CheckContext) -> list[val.Check]:
    """Output, finiteness and top-1 lines (see :func:`trtqat.export.validate.compare`), plus
    the Q/DQ inventory for INT8 and FP8."""
    int8 = variant_row(variant).qdq
    counted = context.counted or [True] * len(reference)
    pairs = [(list(c), list(r), k) for c, r, k in zip(candidate, reference, counted)]
    checks = val.compare(variant, pairs, context.names,
                         context.noise_floor() if int8 else None, context.half_floor)
    if int8 and context.traced is not None and context.onnx_path:
        from trtqat.export.qdq_check import check_qdq_inventory

        checks.append(check_qdq_inventory(onnx.load(context.onnx_path), context.traced,
                                          fp16=variant_row(variant).fp16))
    return checks


def embedding_checks(variant: str, reference: Outputs, candidate: Outputs,
                     context: CheckContext) -> list[val.Check]:
    """One cosine line for the first output (the sentence embedding)."""
    shapes = [tuple(int(d) for d in b[0].shape[:2]) for b in context.batches]
    pairs = [(c[0], r[0]) for c, r in zip(candidate, reference)]
    return [fidelity_check(variant, context.names[0], pairs, shapes)]


def fidelity_check(variant: str, name: str, pairs: Sequence[tuple[np.ndarray, np.ndarray]],
                   shapes: Sequence[tuple[int, ...]], unit: str = "sentences",
                   axes: str = "batch x sequence") -> val.Check:
    """One line: max abs diff and the mean/min cosine of ORT vs PyTorch embeddings (the mean
    must reach :data:`MIN_MEAN_COSINE`, every row, a sentence or a token (``unit``),
    :data:`MIN_COSINE`); ``shapes``: each batch's ``axes``."""
    title = f"output '{name}' vs PyTorch" + (" fake-quant" if variant_row(variant).quantized
                                             else "")
    for (got, ref), shape in zip(pairs, shapes):
        if got.shape != ref.shape:
            return val.Check(title, False, f"shape {got.shape} from ONNX Runtime, {ref.shape} "
                             f"from PyTorch at {axes} {shape}")
    cos = np.concatenate([row_cosines(g, r) for g, r in pairs])
    max_abs = max(float(np.abs(g - r).max(initial=0.0)) for g, r in pairs)
    tol, mean_tol = MIN_COSINE[variant], MIN_MEAN_COSINE[variant]
    ok = (bool(np.isfinite(cos).all()) and float(cos.min()) >= tol
          and float(cos.mean()) >= mean_tol)
    detail = (f"cosine mean {cos.mean():.6f} (>= {mean_tol}), min {cos.min():.6f} (>= {tol}), "
              f"max abs diff {max_abs:.3g}")
    if variant == "fp32":
        ok = ok and max_abs <= FP32_MAX_ABS
        detail += f" (<= {FP32_MAX_ABS:.0e})"
    shown = ", ".join("x".join(str(d) for d in s) for s in shapes)
    return val.Check(title, ok, f"{detail}; {len(cos)} {unit} at {axes} {shown}")

"""Check an exported file numerically: ONNX Runtime against the PyTorch model.

Tolerances, per variant (``d`` = ORT - PyTorch, per output, over every checked batch):

- fp32: ``max|d| / max|ref| <= 1e-4``.
- fp16: ``max|d| / max|ref| <= 1e-2`` (fp16 keeps ~3 significant digits per layer).
- int8, against the PyTorch fake-quant model: with ``step = max|ref| / 127`` (one int8 step
  of the output's own range), ``mean|d| <= step / 4`` and at least 99% of the elements
  within one step. A wrong scale, axis or missing Q/DQ moves every element by many steps;
  what is left are codes that round the other way because float sums run in another
  order (a trained ResNet18 on digits: mean 0.02 step, 99.97% within one step).
- int8-fp16: fp16 re-rounds every activation before it is quantized, so more codes flip:
  ``mean|d| <= 1 step`` and at least 95% within one step (ResNet18 on digits: 0.3 step, 98%).
- classifiers (2-D outputs): top-1 agreement >= 99% over the validation data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trtqat.finite import describe, first_non_finite

log = logging.getLogger(__name__)

REL_TOL = {"fp32": 1e-4, "fp16": 1e-2}
INT8_TOL = {"int8": (0.25, 0.99), "int8-fp16": (1.0, 0.95)}  # (mean steps, share within 1)
TOP1_MIN = 0.99


@dataclass(frozen=True)
class Check:
    """One pass/fail line of a validation."""

    name: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {self.detail}"


def ort_session(path: str | os.PathLike, optimize: bool = False):
    """A CPU ONNX Runtime session that does not print its warnings (severity 3).

    Graph optimizations are off by default: ORT then runs the graph as written (float ops on
    dequantized values), so a comparison tests the file rather than ORT's own integer
    fusions, whose requantization rounds differently.
    """
    from trtqat.optional import require

    ort = require("onnxruntime", "ort", "checking the exported ONNX")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


_ORT_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
           "tensor(double)": np.float64}


def run_ort(session, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Run ``session`` on torch tensors (cast to each input's ONNX type)."""
    feed = {}
    for meta, x in zip(session.get_inputs(), inputs):
        arr = x.detach().cpu().numpy()
        feed[meta.name] = arr.astype(_ORT_NP.get(meta.type, arr.dtype), copy=False)
    return [np.asarray(o, dtype=np.float32) for o in session.run(None, feed)]


@torch.no_grad()
def run_torch(model: nn.Module, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Outputs of ``model`` as float32 arrays (tuple/list outputs flattened)."""
    out = model(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.detach().float().cpu().numpy() for o in outs]


def rebatch(batches: Iterable[tuple[torch.Tensor, ...]], size: int | None
            ) -> list[tuple[tuple[torch.Tensor, ...], int]]:
    """Batches as ``(inputs, n_valid)``; a fixed ``size`` re-chunks and pads the last one."""
    batches = list(batches)
    if size is None or not batches:
        return [(b, b[0].shape[0]) for b in batches]
    joined = [torch.cat([b[i] for b in batches]) for i in range(len(batches[0]))]
    total = joined[0].shape[0]
    out = []
    for start in range(0, total, size):
        chunk = [t[start:start + size] for t in joined]
        n = chunk[0].shape[0]
        if n < size:  # pad by repeating the first rows; only n rows are compared
            chunk = [torch.cat([c, t[: size - n]]) for c, t in zip(chunk, joined)]
        out.append((tuple(chunk), n))
    return out


class _Stats:
    """Running statistics of one output's differences."""

    def __init__(self) -> None:
        self.max_diff = 0.0
        self.max_ref = 0.0
        self.diffs: list[np.ndarray] = []
        self.refs: list[np.ndarray] = []
        self.agree = 0
        self.samples = 0

    def add(self, got: np.ndarray, ref: np.ndarray, top1: bool) -> None:
        d = np.abs(got - ref)
        self.max_diff = max(self.max_diff, float(d.max(initial=0.0)))
        self.max_ref = max(self.max_ref, float(np.abs(ref).max(initial=0.0)))
        self.diffs.append(d.ravel())
        if top1 and ref.ndim == 2 and ref.shape[1] > 1:
            self.agree += int((got.argmax(1) == ref.argmax(1)).sum())
            self.samples += ref.shape[0]


def compare(variant: str, pairs: Iterable[tuple[list[np.ndarray], list[np.ndarray], bool]],
            names: Sequence[str]) -> list[Check]:
    """Checks for ``(onnx_outputs, torch_outputs, counts_for_top1)``, a line per output.

    Top-1 agreement is computed over the pairs marked for it (the validation data, not
    random example inputs, whose logits can tie).
    """
    stats = [_Stats() for _ in names]
    for got, ref, top1 in pairs:
        for s, g, r in zip(stats, got, ref):
            if g.shape != r.shape:
                return [Check(f"output '{names[0]}'", False,
                              f"shape {g.shape} from ONNX Runtime, {r.shape} from PyTorch")]
            s.add(g, r, top1)
    checks = []
    for name, s in zip(names, stats):
        checks.append(_output_check(variant, name, s))
        if s.samples:
            rate = s.agree / s.samples
            checks.append(Check(f"top-1 agreement '{name}'", rate >= TOP1_MIN,
                                f"{rate:.2%} of {s.samples} samples (>= {TOP1_MIN:.0%})"))
    return checks


def _output_check(variant: str, name: str, s: _Stats) -> Check:
    scale = max(s.max_ref, np.finfo(np.float32).tiny)
    if variant in REL_TOL:
        rel = s.max_diff / scale
        tol = REL_TOL[variant]
        return Check(f"output '{name}' vs PyTorch", rel <= tol,
                     f"max rel diff {rel:.2e} (<= {tol:.0e}), max abs diff {s.max_diff:.3g}")
    step = scale / 127.0
    d = np.concatenate(s.diffs) if s.diffs else np.zeros(1)
    mean_steps = float(d.mean()) / step
    within = float((d <= step * (1 + 1e-6)).mean())
    mean_tol, within_tol = INT8_TOL[variant]
    ok = mean_steps <= mean_tol and within >= within_tol
    return Check(f"output '{name}' vs PyTorch fake-quant", ok,
                 f"mean diff {mean_steps:.3f} step (<= {mean_tol}), "
                 f"{within:.2%} within 1 step (>= {within_tol:.0%}), "
                 f"max {s.max_diff / step:.2f} step; step = {step:.3g}")


def finite_checks(pairs: Iterable[tuple[list[np.ndarray], list[np.ndarray], bool]],
                  names: Sequence[str]) -> list[Check]:
    """One hard check per side: every output of ONNX Runtime and of PyTorch is finite.

    NaN drops out of a max difference and argmax agrees on NaN, so the difference checks
    alone would pass a NaN model.
    """
    pairs = list(pairs)
    checks = []
    for side, index in (("ONNX Runtime", 0), ("PyTorch", 1)):
        found = first_non_finite((f"{names[i] if i < len(names) else i}", out)
                                 for pair in pairs for i, out in enumerate(pair[index]))
        checks.append(Check(f"finite outputs ({side})", found is None,
                            "every output value is finite" if found is None
                            else describe(found)))
    return checks

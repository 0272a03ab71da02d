"""Check an exported file numerically: ONNX Runtime against the PyTorch model.

Tolerances, per variant (``d`` = ORT - PyTorch, per output, over every checked batch):

- every variant: every output finite (NaN or inf always fails).
- fp32: ``max|d| / max|ref| <= 1e-4``, or, when that fails, at most 4x PyTorch's own
  float32 error (the model rerun in float64, same inputs: :func:`~trtqat.export.criterion.
  half_floor`): float32 rounding grows with the output's magnitude and the model's depth
  (torchvision's efficientnet_v2_s, logits up to 1752, drifts 2e-4 with no export bug).
  A model whose float32 rerun does not repeat its outputs bit for bit has no such floor.
- fp16: ``max|d| / max|ref| <= 1e-2`` (fp16 keeps ~3 significant digits per layer).
- int8 and int8-fp16, against the PyTorch fake-quant model: the criterion of
  :mod:`trtqat.export.criterion` (hard failures for export bugs, rounding noise reported
  against a measured noise floor), plus the Q/DQ inventory of :mod:`trtqat.export.qdq_check`.
- classifiers (2-D outputs): top-1 agreement, tested against 99.5% with a bound that
  accounts for the sample size (:func:`trtqat.export.criterion.top1_verdict`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trtqat.export import criterion as crit
from trtqat.outputs import leaves
from trtqat.threads import cpu_threads
from trtqat.variants import TABLE

log = logging.getLogger(__name__)

REL_TOL = {v.name: v.rel_tol for v in TABLE if v.rel_tol is not None}  # the variants table
# float variants, and variants computed in float16: their tolerance may grow to PyTorch's own
# drift (fp32: its float32 error against float64; fp16: float16 against float32)
HALF_FLOOR_VARIANTS = frozenset(v.name for v in TABLE if v.fp16 or v.rel_tol is not None)


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
    threads = cpu_threads()
    if threads:
        opts.intra_op_num_threads = threads
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
    """Outputs of ``model`` as float32 arrays (tuples, lists and dicts flattened in the
    export's order, :func:`trtqat.outputs.flatten`)."""
    return [o.detach().float().cpu().numpy() for o in leaves(model(*inputs))]


Slice = tuple[str, int, int, int]  # label, axis, start, stop


def split_outputs(arrays: Sequence[np.ndarray], names: Sequence[str],
                  slices: dict[str, Sequence[Slice]] | None) -> tuple[list[str], list[np.ndarray]]:
    """Names and arrays with every output ``slices`` declares replaced by its parts
    (``output[boxes]``...), so each part is checked on its own scale (box coordinates in
    pixels next to class scores in [0, 1] would otherwise share one step size)."""
    out_names: list[str] = []
    out: list[np.ndarray] = []
    for i, name in enumerate(names):
        array = arrays[i] if i < len(arrays) else None
        for label, axis, start, stop in (slices or {}).get(name, ()):
            out_names.append(f"{name}[{label}]")
            if array is not None:
                index = [slice(None)] * array.ndim
                index[axis] = slice(start, stop)
                out.append(array[tuple(index)])
        if name not in (slices or {}):
            out_names.append(name)
            if array is not None:
                out.append(array)
    return out_names, out


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
    """Running statistics of one output's differences (finite elements only)."""

    def __init__(self) -> None:
        self.max_diff = 0.0
        self.max_ref = 0.0
        self.sum_diff = 0.0
        self.count = 0
        self.diffs: list[np.ndarray] = []
        self.agree = 0
        self.samples = 0
        self.margins: list[float] = []  # reference top-1 margins of the disagreeing samples
        self.bad_got = 0
        self.bad_ref = 0

    def add(self, got: np.ndarray, ref: np.ndarray, top1: bool) -> None:
        self.bad_got += crit.non_finite([got])
        self.bad_ref += crit.non_finite([ref])
        d = np.abs(got.astype(np.float64) - ref)
        d = d[np.isfinite(d)]
        finite_ref = np.abs(ref[np.isfinite(ref)])
        self.max_diff = max(self.max_diff, float(d.max(initial=0.0)))
        self.max_ref = max(self.max_ref, float(finite_ref.max(initial=0.0)))
        self.sum_diff += float(d.sum())
        self.count += d.size
        self.diffs.append(d.astype(np.float32))
        if top1 and ref.ndim == 2 and ref.shape[1] > 1:
            same = got.argmax(1) == ref.argmax(1)
            self.agree += int(same.sum())
            self.samples += ref.shape[0]
            top2 = np.sort(ref[~same].astype(np.float64), axis=1)[:, -2:]
            self.margins += [float(m) for m in top2[:, 1] - top2[:, 0]]

    def ties(self, floor: crit.NoiseFloor | None) -> int:
        """Disagreements that are rounding ties under ``floor`` (see criterion.tie_margin)."""
        margin = crit.tie_margin(floor)
        return sum(m <= margin for m in self.margins)


def compare(variant: str, pairs: Iterable[tuple[list[np.ndarray], list[np.ndarray], bool]],
            names: Sequence[str], floors: Sequence[crit.NoiseFloor] | None = None,
            half_floors: Callable[[], Sequence[crit.HalfFloor] | None] | None = None
            ) -> list[Check]:
    """Checks for ``(onnx_outputs, torch_outputs, counts_for_top1)``, a line per output.

    Top-1 agreement is computed over the pairs marked for it (the validation data, not
    random example inputs, whose logits can tie). ``floors`` (one per output) is the
    measured rounding noise of INT8 variants (:func:`trtqat.export.criterion.noise_floor`).
    ``half_floors`` (fp16 variants, called only when a check fails otherwise) is what
    PyTorch's own float16 run does to the model (:func:`trtqat.export.criterion.half_floor`):
    the file may then drift up to twice as much and flip top-1 twice as often.
    """
    stats = [_Stats() for _ in names]
    for got, ref, top1 in pairs:
        for s, g, r in zip(stats, got, ref):
            if g.shape != r.shape:
                return [Check(f"output '{names[0]}'", False,
                              f"shape {g.shape} from ONNX Runtime, {r.shape} from PyTorch")]
            s.add(g, r, top1)
    measured: list = []

    def half(i: int) -> crit.HalfFloor | None:
        if variant not in HALF_FLOOR_VARIANTS or half_floors is None:
            return None
        if not measured:
            measured.append(half_floors())
        found = measured[0]
        return found[i] if found is not None and i < len(found) else None

    checks = []
    for i, (name, s) in enumerate(zip(names, stats)):
        floor = floors[i] if floors is not None and i < len(floors) else None
        if s.bad_got or s.bad_ref:
            checks.append(Check(f"output '{name}' finite", False,
                                f"{s.bad_got} NaN/inf values from ONNX Runtime, {s.bad_ref} "
                                "from PyTorch: the model or its export produces non-finite "
                                "outputs; check the checkpoint's weights and amax values"))
        checks.append(_output_check(variant, name, s, floor, lambda i=i: half(i)))
        if s.samples:
            int_floor = floor if variant in crit.MEAN_LIMIT else None
            ok, detail = crit.top1_verdict(s.agree, s.samples, int_floor, s.ties(int_floor))
            if not ok and (hf := half(i)) is not None:
                ok, detail = crit.top1_verdict(s.agree, s.samples, hf)
            checks.append(Check(f"top-1 agreement '{name}'", ok, detail))
    return checks


def _output_check(variant: str, name: str, s: _Stats, floor: crit.NoiseFloor | None,
                  half: Callable[[], crit.HalfFloor | None] = lambda: None) -> Check:
    scale = max(s.max_ref, np.finfo(np.float32).tiny)
    if variant in REL_TOL:
        rel = s.max_diff / scale
        tol, why = REL_TOL[variant], ""
        hf = half() if rel > tol else None
        margin = crit.floor_margin(variant)
        if hf is not None and margin * hf.max_rel > tol:
            tol = margin * hf.max_rel
            what = "float32 error" if variant in crit.FLOAT32_RUNS else "float16 drift"
            why = f": {margin:g}x PyTorch's own {what} {hf.max_rel:.2e}"
        return Check(f"output '{name}' vs PyTorch", rel <= tol,
                     f"max rel diff {rel:.2e} (<= {tol:.1e}{why}), max abs diff "
                     f"{s.max_diff:.3g}")
    step = scale / 127.0
    mean = s.sum_diff / max(s.count, 1)
    d = np.concatenate(s.diffs) if s.diffs else np.zeros(1)
    within = float((d <= step * (1 + 1e-6)).mean()) if d.size else 0.0  # all non-finite
    limit = crit.mean_limit(variant, floor, step)
    floor_text = ("noise floor not measured" if floor is None else
                  f"noise floor {floor.mean_abs / step:.3f} step")
    hf = half() if mean > limit else None
    if hf is not None and crit.FLOOR_MARGIN * hf.mean_abs > limit:
        limit = crit.FLOOR_MARGIN * hf.mean_abs
        floor_text += (f"; {crit.FLOOR_MARGIN:g}x PyTorch's own float16 drift "
                       f"{hf.mean_abs / step:.3f} step")
    return Check(f"output '{name}' vs PyTorch fake-quant", mean <= limit,
                 f"mean diff {mean / step:.3f} step (<= {limit / step:.2f}; {floor_text}); "
                 f"rounding noise, reported: {within:.2%} within 1 step, max "
                 f"{s.max_diff / step:.2f} step; step = {step:.3g}")

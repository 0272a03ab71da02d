"""The integer-or-faithful verdict of the CPU re-encoding (:mod:`trtqat.engines.ort_qdq`):
what it depended on (:func:`verdict_record`, stored in the engine's metadata and header),
its figures as text, and the one-line error when both graphs fail the check."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from trtqat.atomic import write_atomic
from trtqat.engines.ort_inspect import DEFAULT_MIN_COSINE, AgreementError
from trtqat.engines.ort_u8s8 import u8s8_saturates

# The re-encoding's calibration, constant folding and agreement check run ORT on this many
# intra-op threads, whatever --threads says: float sums split across threads round
# differently, which moved borderline verdicts (and added quantizer scales) between builds.
BUILD_THREADS = 1


def agreement_text(agreement: dict[str, Any]) -> str:
    """The figures of one agreement check, e.g. ``top-1 agreement 81.25%, centered cosine
    0.9712``."""
    if agreement.get("non_finite"):
        return "non-finite outputs"
    if "mean_cosine" in agreement:
        return f"mean cosine {agreement['mean_cosine']:.4f}"
    what = "detection" if agreement.get("metric") == "detection" else "top-1"
    text = f"{what} agreement {agreement.get('top1_agreement', float('nan')):.2%}"
    if agreement.get("metric") == "top1":
        text += f", centered cosine {agreement.get('mean_centered_cosine', float('nan')):.4f}"
    return text


def _figure(agreement: dict[str, Any] | None) -> float | None:
    """The figure the verdict compares: mean cosine (embeddings) or top-1 agreement."""
    if not agreement:
        return None
    return agreement.get("mean_cosine", agreement.get("top1_agreement"))


def verdict_record(feeds: list, kwargs: dict[str, Any], integer: dict[str, Any] | None,
                   faithful: dict[str, Any] | None = None,
                   synthetic: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the integer-or-faithful verdict depended on: the check inputs (``synthetic``:
    their description when no calibration inputs were given), the metric and threshold,
    and the figure measured for each graph tried (None: not built; top-1: also the
    decisive samples and each graph's mean centered cosine)."""
    metric = (integer or faithful or {}).get("metric")
    threshold = (kwargs.get("min_cosine") if metric == "cosine" else kwargs.get("min_top1"))
    if metric == "cosine" and threshold is None:
        threshold = DEFAULT_MIN_COSINE
    checked = bool(feeds) or bool(synthetic)
    record = {"inputs": len(feeds) if feeds else (synthetic or {}).get("feeds", 0),
              "samples": (integer or faithful or {}).get("samples", 0),
              "source": ("calib_feeds" if feeds else "synthetic" if synthetic
                         else "none (not checked)"),
              "metric": metric, "threshold": threshold if checked else None,
              "threads": BUILD_THREADS, "integer": _figure(integer),
              "faithful": _figure(faithful)}
    if metric == "top1":  # the rule's other figures: decisive samples, centered cosine
        cos = kwargs.get("min_cosine")
        record.update(
            decisive=(integer or faithful or {}).get("decisive"),
            centered_cosine_threshold=DEFAULT_MIN_COSINE if cos is None else cos,
            centered_cosine={k: (v or {}).get("mean_centered_cosine")
                             for k, v in (("integer", integer), ("faithful", faithful))})
    if synthetic and not feeds:
        record["synthetic"] = synthetic
    return record


def _inspect_dir(*errors: AgreementError) -> str | None:
    """The graphs ``errors`` checked, saved for the user in a new temporary folder."""
    found = [(name, getattr(e, "model", None)) for name, e in zip(("integer", "faithful"),
                                                                   errors)]
    if not any(m is not None for _, m in found):
        return None
    try:
        folder = Path(tempfile.mkdtemp(prefix="trtqat-reencoded-"))
        for name, graph in found:
            if graph is not None:
                write_atomic(folder / f"{name}.onnx", lambda f, g=graph: f.write(
                    g.SerializeToString()))
    except OSError:  # no room to keep them: the message says so by naming no folder
        return None
    return str(folder)


def both_failed(integer: AgreementError, faithful: AgreementError, kwargs: dict[str, Any],
                 inputs: str) -> AgreementError:
    """One line: both re-encodings failed the check, with both figures and what to do."""
    def figure(error: AgreementError) -> str:
        if error.agreement:
            return agreement_text(error.agreement)
        return str(error).splitlines()[0].split(": ", 1)[-1].split(";")[0]

    found = integer.agreement or faithful.agreement or {}
    metric, top1 = found.get("metric"), kwargs.get("min_top1", 0.99)
    cos = kwargs.get("min_cosine")
    cos = DEFAULT_MIN_COSINE if cos is None else cos
    needs = {"cosine": f"mean cosine >= {cos:.4f}",
             "top1": f"top-1 >= {top1:.2%} where decisive and centered cosine >= {cos:.4f}",
             "detection": f"detection agreement >= {top1:.2%}"}.get(metric)
    n = found.get("samples")
    where = _inspect_dir(integer, faithful)
    text = (f"CPU re-encoding moved the outputs too far on {inputs}: fully integer graph: "
            f"{figure(integer)}; faithful graph: {figure(faithful)}"
            + (f" (needs {needs}, on {n} inputs)" if needs else "")
            + (f"; inspect {where} or" if where else ";") + " build with --ortPrepare=none")
    if kwargs.get("u8s8_exact") and u8s8_saturates():
        text += ("; with --cpuInt8=fast on this CPU, whose uint8 x int8 kernels saturate: "
                 "build with --cpuInt8=exact")
    error = AgreementError(text)
    error.agreement = faithful.agreement
    return error

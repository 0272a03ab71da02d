"""Running ONNX Runtime sessions for the ORT backend: ORT's own failures as one-line errors,
and the first inference every built engine must pass before it is handed out.

ORT checks some kernel parameters only when a kernel runs (QLinearGlobalAveragePool's scale
range, for one), so a model that loads may still fail its first inference. The builder runs
one (:func:`first_inference`) on the check inputs it was given, or on synthetic inputs from
the engine's input shapes, and refuses an engine that fails it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from trtqat.engines.base import check_shape, random_feed
from trtqat.engines.errors import EngineBuildError, EngineRunError
from trtqat.engines.specs import TensorSpec
from trtqat.errors import TrtqatError

T = TypeVar("T")
RERUN_HINT = ("rebuild it with 'trtqat build' (--ortPrepare=none runs the Q/DQ graph as "
              "exported)")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def ort_call(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, with ORT's own exceptions (pybind types such as RuntimeException,
    Fail, InvalidArgument) raised as one-line :class:`EngineRunError`."""
    try:
        return fn(*args)
    except TrtqatError:
        raise
    except Exception as exc:  # ORT's pybind exception types share no base but Exception
        raise EngineRunError(f"ONNX Runtime failed running {what}: {first_line(exc)}; "
                             f"{RERUN_HINT}") from None


def check_feed(inputs: Sequence[TensorSpec],
               calib_feeds: Sequence[Mapping[str, Any]] | None) -> tuple[dict[str, np.ndarray], str]:
    """The inputs of the build's first inference and where they came from: the first
    calibration feed when it fits the engine's inputs, else trtexec-style random values
    (seed 0) of each input's default shape."""
    if calib_feeds:
        first = calib_feeds[0]
        try:
            feed = {s.name: np.asarray(first[s.name]) for s in inputs}
            for spec in inputs:
                check_shape(spec, tuple(feed[spec.name].shape))
                if feed[spec.name].dtype != np.dtype(spec.dtype):
                    raise TypeError(spec.name)
            return feed, "the first calibration input"
        except (KeyError, TypeError, TrtqatError):
            pass
    return random_feed(inputs, seed=0), "synthetic inputs (seed 0) of the input shapes"


def first_inference(session: Any, inputs: Sequence[TensorSpec],
                    calib_feeds: Sequence[Mapping[str, Any]] | None, what: str,
                    reencoded: bool) -> str:
    """Run ``session`` once (see :func:`check_feed`); an ORT failure raises
    :class:`EngineBuildError`, and so do non-finite float outputs on calibration inputs
    (random inputs may push a valid model there). Returns where the inputs came from."""
    feed, source = check_feed(inputs, calib_feeds)
    fix = ("build with --ortPrepare=none (runs the Q/DQ graph as exported)" if reencoded
           else "check that onnxruntime runs the ONNX itself")
    try:
        outputs = session.run(None, feed)
    except TrtqatError:
        raise
    except Exception as exc:  # ORT's pybind exception types
        raise EngineBuildError(f"{what}: the built engine fails its first inference in ONNX "
                               f"Runtime ({first_line(exc)}); {fix}") from None
    if source.startswith("the first calibration"):
        for out in outputs:
            array = np.asarray(out)
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise EngineBuildError(f"{what}: the built engine gives non-finite outputs on "
                                       f"{source}; {fix}")
    return source


def layer_times(trace: Path, iterations: int) -> dict[str, float]:
    """Mean milliseconds per node (``name [op]``), slowest first, from an ORT profile trace
    of ``iterations`` runs. A trace cut short (ORT ignores its own write errors) is a
    one-line :class:`~trtqat.atomic.WriteError`."""
    from trtqat.atomic import WriteError

    try:
        events = json.loads(trace.read_text())
    except (OSError, ValueError):
        raise WriteError(f"cannot write ONNX Runtime's layer profile {trace}: it is cut short "
                         "(no space left, or a file size limit); free some space in the "
                         "temporary folder or set TMPDIR to another one") from None
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            name = event["name"][: -len("_kernel_time")]
            op = event.get("args", {}).get("op_name", "")
            totals[f"{name} [{op}]" if op else name] += event.get("dur", 0) / 1000.0
    return dict(sorted(((k, v / iterations) for k, v in totals.items()), key=lambda kv: -kv[1]))


__all__ = ["check_feed", "first_inference", "first_line", "layer_times", "ort_call"]

"""``benchmark``: time an engine the way ``trtqat-exec`` (and trtexec) does."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from trtqat.engines.base import Engine, Runner
from trtqat.engines.errors import OptionsError
from trtqat.engines.specs import Shape
from trtqat.engines.timing import BenchmarkResult, BenchmarkSettings


def benchmark(engine: Engine | Runner | str | os.PathLike[str],
              shapes: Mapping[str, Shape] | str | None = None, *,
              inputs: Mapping[str, Any] | None = None, duration: float = 3.0,
              warmup: float = 0.2, iterations: int = 10, avg_runs: int = 10,
              percentiles: Sequence[float] = (90.0, 95.0, 99.0),
              data_transfers: bool | None = None, cuda_graph: bool | None = None,
              backend: str | None = None, settings: BenchmarkSettings | None = None,
              threads: int | None = None, device: int = 0, spin_wait: bool = False,
              streams: int = 1) -> BenchmarkResult:
    """Time ``engine`` with trtexec's measurement model; what ``trtqat-exec`` prints.

    ``engine``: an :class:`Engine` (``trtqat.build_engine``), the path of a saved engine
    (``backend``: None reads it from the file) or an active :class:`Runner`. The inputs are
    random like trtexec's at ``shapes`` (a dict or ``"input:8x3x224x224"``; default: each
    input's optimum shape; token ids of encoders are valid ids), replaced by the arrays of
    ``inputs`` (by name) where given. Queries in the first ``warmup`` seconds are discarded
    (trtexec's ``--warmUp=200`` ms is ``warmup=0.2``), then at least ``iterations`` are timed
    for ``duration`` seconds; ``settings`` replaces these timing arguments. ``threads``
    (ONNX Runtime), ``device``, ``spin_wait`` and ``streams`` (TensorRT) go to the runner of
    the backends that take them.

    Returns the :class:`BenchmarkResult`: ``throughput_qps``, ``latency``/``compute``/
    ``enqueue`` statistics (min, max, mean, median, ``percentiles``, ``cov``: the spread as
    a coefficient of variation in percent) and every query's times; ``summary_lines()``
    prints trtexec's summary. Example usage::

        result = trtqat.benchmark("model.engine", shapes={"input": (8, 3, 224, 224)})
        print(result.throughput_qps, result.latency.median, result.latency.cov)
    """
    from trtqat.engines.feeds import engine_feed
    from trtqat.engines.registry import backend_info, load_engine
    from trtqat.engines.specs import parse_shapes

    if isinstance(shapes, str):
        shapes = parse_shapes(shapes)
    if settings is None:
        settings = BenchmarkSettings(
            warmup_ms=_seconds(warmup, "warmup") * 1000.0, duration_s=_seconds(duration, "duration"),
            iterations=iterations, avg_runs=avg_runs, percentiles=tuple(percentiles),
            data_transfers=data_transfers, cuda_graph=cuda_graph)
    if isinstance(engine, Runner):
        feed = engine_feed(engine.engine, shapes, inputs)
        return engine.benchmark(feed, settings)
    if not isinstance(engine, Engine):
        engine = load_engine(engine, backend)
    feed = engine_feed(engine, shapes, inputs)
    options = backend_info(engine.backend).runner_kwargs(
        device=device, threads=threads, spin_wait=spin_wait, streams=streams)
    with engine.runner(**options) as runner:
        return runner.benchmark(feed, settings)


def _seconds(value: float, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{name} must be a number of seconds, got {value!r}") from None
    return value

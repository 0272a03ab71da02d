"""``trtqat-exec``: trtexec's command line for the trtqat engines (ONNX Runtime or TensorRT).

    trtqat-exec --onnx=model.onnx --shapes=input:1x3x224x224 --saveEngine=model.engine
    trtqat-exec --loadEngine=model.engine --duration=5 --exportTimes=times.json

Flags are spelled like trtexec's (``--flag=value`` or ``--flag value``). The summary block
follows trtexec's measurement model; see ``trtqat.engines.timing``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from trtqat.cli.validate import OneLineParser, check_engine_outputs, writable_file
from trtqat.errors import TrtqatError

PROG = "trtqat-exec"
_UNITS = {"": 1 << 20, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


_Parser = OneLineParser  # argparse with one-line errors


def parse_mem_pools(text: str) -> dict[str, int]:
    """``workspace:1024,tacticSharedMem:64K`` -> bytes per pool (default unit MiB, as trtexec)."""
    from trtqat.engines.errors import OptionsError

    pools = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"([A-Za-z]+):([0-9]*\.?[0-9]+)([BKMG]?)", item)
        if not match:
            raise OptionsError(f"--memPoolSize: '{item}' is not pool:size[B|K|M|G], e.g. "
                               "--memPoolSize=workspace:1024")
        pools[match[1]] = int(float(match[2]) * _UNITS[match[3]])
    return pools


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``90,95,99`` -> (90.0, 95.0, 99.0)."""
    from trtqat.engines.errors import OptionsError

    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise OptionsError(f"--percentile: '{text}' is not a list like 90,95,99") from None
    if not values or not all(0 <= p <= 100 for p in values):
        raise OptionsError(f"--percentile: values must be in 0..100, got '{text}'")
    return values


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``trtqat-exec`` and ``trtqat build`` (trtexec spellings)."""
    parser.add_argument("--backend", default="ort", help="ort (ONNX Runtime, default) or tensorrt")
    for flag, text in (("--shapes", "shapes to run with (and min=opt=max when building)"),
                       ("--minShapes", "profile minimum shapes"), ("--optShapes", "profile "
                       "optimum shapes"), ("--maxShapes", "profile maximum shapes")):
        parser.add_argument(flag, metavar="name:1x3x224x224,...", help=text)
    parser.add_argument("--fp16", action="store_true", help="FP16 builder flag (TensorRT 10)")
    parser.add_argument("--int8", action="store_true", help="INT8 builder flag (TensorRT 10)")
    parser.add_argument("--best", action="store_true", help="FP16+INT8 builder flags (TensorRT 10)")
    parser.add_argument("--stronglyTyped", action="store_true",
                        help="strongly typed network (TensorRT 10; always on in 11)")
    parser.add_argument("--memPoolSize", metavar="workspace:1024", help="pool sizes, MiB default")
    parser.add_argument("--builderOptimizationLevel", type=int, metavar="N", help="0..5")
    parser.add_argument("--timingCacheFile", metavar="FILE", help="TensorRT timing cache")
    parser.add_argument("--threads", type=int, metavar="N", help="ONNX Runtime intra-op threads")
    parser.add_argument("--providers", default="cpu", metavar="cpu|cuda|tensorrt,...",
                        help="ONNX Runtime execution providers (default cpu)")
    parser.add_argument("--ortPrepare", metavar="STEP", default="auto",
                        help="ONNX transform before ORT: auto (default: re-encode TensorRT-style "
                        "Q/DQ for integer CPU kernels when the CPU provider runs it), qdq, none")
    parser.add_argument("--calibInputs", metavar="FILE.npz", default=None,
                        help="real inputs (arrays named after the model inputs, batch first; "
                        "int64 token ids/masks for encoders) that calibrate the CPU "
                        "re-encoding and check the engine agrees with the ONNX (top-1 >= "
                        "99%%, or mean cosine >= 0.99 for embedding outputs)")
    parser.add_argument("--verbose", action="store_true", help="verbose logging")


def build_options_from_args(args: argparse.Namespace) -> Any:
    """BuildOptions from the shared flags."""
    from trtqat.engines import BuildOptions, parse_shapes

    def shapes(flag: str) -> dict:
        text = getattr(args, flag)
        return parse_shapes(text, f"--{flag}") if text else {}

    return BuildOptions(
        shapes=shapes("shapes"), min_shapes=shapes("minShapes"), opt_shapes=shapes("optShapes"),
        max_shapes=shapes("maxShapes"), fp16=args.fp16, int8=args.int8, best=args.best,
        strongly_typed=args.stronglyTyped,
        memory_pools=parse_mem_pools(args.memPoolSize) if args.memPoolSize else {},
        builder_optimization_level=args.builderOptimizationLevel,
        timing_cache=args.timingCacheFile, threads=args.threads,
        providers=tuple(p.strip() for p in args.providers.split(",") if p.strip()),
        ort_prepare=args.ortPrepare, verbose=args.verbose,
        calib_feeds=load_calib_inputs(args.calibInputs) if args.calibInputs else None)


def load_calib_inputs(path: str) -> tuple[dict, ...]:
    """Calibration feeds from an .npz file: one feed per 8 samples of the arrays."""
    import zipfile

    import numpy as np

    from trtqat.engines import OptionsError

    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise OptionsError(f"--calibInputs: cannot read {path} ({exc}); save arrays with "
                           "numpy.savez(path, input_name=array)") from None
    if not arrays or len({len(a) for a in arrays.values()}) != 1:
        raise OptionsError(f"--calibInputs: {path} must hold arrays with one common batch size")
    n = len(next(iter(arrays.values())))
    return tuple({k: v[i:i + 8] for k, v in arrays.items()} for i in range(0, n, 8))


def build_parser() -> argparse.ArgumentParser:
    """The ``trtqat-exec`` argument parser."""
    p = _Parser(prog=PROG, allow_abbrev=False,
                description="Build and benchmark an engine the way trtexec does.")
    model = p.add_argument_group("model")
    model.add_argument("--onnx", metavar="FILE", help="build from this ONNX model")
    model.add_argument("--loadEngine", metavar="FILE", help="load a saved engine")
    model.add_argument("--saveEngine", metavar="FILE", type=writable_file,
                       help="save the built engine")
    model.add_argument("--skipInference", action="store_true", help="build (and save) only")
    add_build_arguments(p)
    run = p.add_argument_group("inference")
    run.add_argument("--warmUp", type=float, default=200.0, metavar="MS", help="default 200")
    run.add_argument("--duration", type=float, default=3.0, metavar="S", help="default 3")
    run.add_argument("--iterations", type=int, default=10, metavar="N", help="default 10")
    run.add_argument("--avgRuns", type=int, default=10, metavar="N", help="default 10")
    run.add_argument("--percentile", default="90,95,99", metavar="P1,P2", help="default 90,95,99")
    graph = run.add_mutually_exclusive_group()
    graph.add_argument("--useCudaGraph", dest="cuda_graph", action="store_const", const=True)
    graph.add_argument("--noCudaGraph", dest="cuda_graph", action="store_const", const=False)
    transfers = run.add_mutually_exclusive_group()
    transfers.add_argument("--noDataTransfers", dest="transfers", action="store_const",
                           const=False)
    transfers.add_argument("--includeDataTransfers", dest="transfers", action="store_const",
                           const=True)
    run.add_argument("--exportTimes", metavar="FILE", type=writable_file,
                     help="per-query times as JSON")
    run.add_argument("--separateProfileRun", action="store_true",
                     help="profile layers in a separate run after timing")
    run.add_argument("--dumpProfile", action="store_true", help="print the per-layer profile")
    return p


def _say(line: str = "") -> None:
    print(line, flush=True)


# Fallback range of token-id inputs whose embedding table cannot be found (the tokenizers
# of the BERT family have far more than 1000 ids).
_SAFE_TOKEN_RANGE = 1000


def _index_bounds(args: argparse.Namespace, engine: Any) -> dict[str, int]:
    """Row counts of the embedding tables the integer inputs index (ONNX or ORT engine)."""
    import onnx

    from trtqat.engines.onnx_io import index_input_bounds

    try:
        if args.onnx:
            model = onnx.load(args.onnx, load_external_data=False)
        elif engine.backend == "ort":
            model = onnx.load_from_string(engine.payload)
        else:
            return {}
    except Exception:  # best effort: the fallback range applies
        return {}
    return index_input_bounds(model)


def valid_integer_feed(feed: dict, bounds: dict[str, int], seed: int = 0) -> dict:
    """Make random integer inputs valid for encoders: ``*mask*`` inputs all ones,
    ``token_type``/``segment`` inputs zeros, other integer inputs (token ids) uniform in
    ``[0, bound)`` (the embedding table's rows, else ``[0, 1000)``). Float and bool inputs
    are kept."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = dict(feed)
    for name, array in feed.items():
        if array.dtype.kind not in "iu":
            continue
        low = name.lower()
        if "mask" in low:
            out[name] = np.ones_like(array)
        elif "token_type" in low or "segment" in low:
            out[name] = np.zeros_like(array)
        else:
            high = bounds.get(name, _SAFE_TOKEN_RANGE)
            out[name] = rng.integers(0, max(1, high), size=array.shape).astype(array.dtype)
    return out


def run(args: argparse.Namespace) -> int:
    """The trtexec flow: build or load, (save), time queries, print the summary."""
    from trtqat.engines import (
        BenchmarkSettings,
        OptionsError,
        builder_class,
        canonical_backend,
        engine_class,
        parse_shapes,
        random_feed,
    )

    if bool(args.onnx) == bool(args.loadEngine):
        raise OptionsError("give exactly one of --onnx=MODEL.onnx and --loadEngine=FILE")
    check_engine_outputs(args, [("--saveEngine", "saveEngine"),
                                ("--exportTimes", "exportTimes")])
    backend = canonical_backend(args.backend)
    options = build_options_from_args(args)
    settings = BenchmarkSettings(
        warmup_ms=args.warmUp, duration_s=args.duration, iterations=args.iterations,
        avg_runs=args.avgRuns, percentiles=parse_percentiles(args.percentile),
        data_transfers=args.transfers, cuda_graph=args.cuda_graph)
    start = time.perf_counter()
    if args.onnx:
        engine = builder_class(backend)(options).build(args.onnx)
        verb, source = "built", args.onnx
    else:
        engine = engine_class(backend).load(args.loadEngine)
        verb, source = "loaded", args.loadEngine
    _say(f"Engine {verb} in {time.perf_counter() - start:.3f} s from {source} "
         f"({backend} {engine.header.get('backend_version')})")
    feed = None
    if not args.skipInference:  # check the run shapes before writing anything
        feed = random_feed(engine.inputs, parse_shapes(args.shapes) if args.shapes else {})
        if any(a.dtype.kind in "iu" for a in feed.values()):
            feed = valid_integer_feed(feed, _index_bounds(args, engine))
    if args.saveEngine:
        _say(f"Engine saved to {engine.save(args.saveEngine)}")
    if feed is None:
        return 0
    for name, array in feed.items():
        _say(f"Input {name}: {array.dtype} {'x'.join(map(str, array.shape))}")
    runner_kwargs = {"threads": args.threads} if backend == "ort" else {}
    with engine.runner(**runner_kwargs) as runner:
        _say("Starting inference")
        result = runner.benchmark(feed, settings)
        _say(f"Data transfers {'included' if result.data_transfers else 'excluded'}, CUDA graph "
             f"{'on' if result.cuda_graph else 'off'}")
        for line in result.trace_lines():
            _say(line)
        if args.verbose:
            _say("=== Trace details ===")
            _say(f"Trace averages of {settings.avg_runs} runs:")
            for line in result.average_lines():
                _say(line)
        for line in result.summary_lines():
            _say(line)
        if args.exportTimes:
            _say(f"Times exported to {result.export_times(args.exportTimes)}")
        if args.separateProfileRun or args.dumpProfile:
            _print_profile(runner.profile_layers(feed, settings.iterations), settings.iterations)
    return 0


def _print_profile(layers: dict[str, float], iterations: int) -> None:
    total = sum(layers.values()) or 1.0
    _say(f"=== Profile ({iterations} iterations, separate run) ===")
    _say(f"{'Avg.(ms)':>10}  {'Time(%)':>7}  Layer")
    for name, ms in layers.items():
        _say(f"{ms:10.4f}  {100 * ms / total:7.1f}  {name}")
    _say(f"{sum(layers.values()):10.4f}  {100.0:7.1f}  Total")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trtqat-exec`` console script."""
    args = build_parser().parse_args(argv)
    # trtqat's own messages (precision notes, fallbacks) go to stderr as "[W] ..." lines
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(levelname).1s] %(message)s"))
    logger = logging.getLogger("trtqat")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    logger.propagate = False
    try:
        return run(args)
    except TrtqatError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


if __name__ == "__main__":
    sys.exit(main())

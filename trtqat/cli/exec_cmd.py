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

from trtqat.cli.exec_feed import load_calib_inputs, make_feed, precheck_input_files
from trtqat.cli.exec_flags import add_trtexec_compat, apply_trtexec_aliases, plan_version
from trtqat.cli.guard import run_guarded
from trtqat.cli.options import add_backend, add_onnx, add_threads
from trtqat.cli.parsing import dry_run_line, dry_run_requested
from trtqat.cli.validate import OneLineParser, check_engine_outputs, writable_file

PROG = "trtqat-exec"
_UNITS = {"": 1 << 20, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


_Parser = OneLineParser  # argparse with one-line errors
CPU_INT8_KERNELS = ("exact", "fast")  # --cpuInt8: BuildOptions.u8s8_guard True / False


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
    from trtqat.engines.registry import backends_help

    add_backend(parser, None, backends_help("the default for --onnx")
                + "; --loadEngine takes it from the file")
    for flag, text in (("--shapes", "run shapes (alone, also min=opt=max when building)"),
                       ("--minShapes", "profile minimum shapes"), ("--optShapes", "profile "
                       "optimum shapes"), ("--maxShapes", "profile maximum shapes")):
        parser.add_argument(flag, metavar="name:1x3x224x224,...", help=text)
    parser.add_argument("--fp16", action="store_true", help="FP16 builder flag (TensorRT 10)")
    parser.add_argument("--int8", action="store_true", help="INT8 builder flag (TensorRT 10)")
    parser.add_argument("--fp8", action="store_true", help="FP8 builder flag (TensorRT 10; "
                        "set by itself for a file with FP8 Q/DQ)")
    parser.add_argument("--int4", action="store_true", help="INT4 builder flag (TensorRT 10; "
                        "set by itself for a file with INT4 weights)")
    parser.add_argument("--best", action="store_true", help="FP16+INT8 builder flags (TensorRT 10)")
    parser.add_argument("--stronglyTyped", action="store_true",
                        help="strongly typed network (TensorRT 10; always on in 11)")
    parser.add_argument("--memPoolSize", metavar="workspace:1024", help="pool sizes, MiB default")
    parser.add_argument("--builderOptimizationLevel", type=int, metavar="N", help="0..5")
    parser.add_argument("--timingCacheFile", metavar="FILE", help="TensorRT timing cache")
    add_threads(parser, "ONNX Runtime intra-op threads, >= 1 (default: ORT's, one per core; "
                "bare, trtexec's multithreading switch: ignored)", bare=True, torch=False)
    parser.add_argument("--providers", metavar="cpu|cuda|tensorrt,...",
                        help="ONNX Runtime execution providers (default cpu)")
    parser.add_argument("--profilingVerbosity", metavar="layer_names_only|detailed|none",
                        help="layer information kept in the engine (default layer_names_only)")
    parser.add_argument("--ortPrepare", metavar="STEP",
                        help="ONNX transform before ORT: auto (default: re-encode TensorRT-style "
                        "Q/DQ for integer CPU kernels when the CPU provider runs it), qdq, none")
    parser.add_argument("--cpuInt8", choices=CPU_INT8_KERNELS, default=None,
                        help="ONNX Runtime's integer CPU kernels on x86 CPUs without VNNI, where "
                        "uint8 x int8 products saturate: exact (default) stores those weights "
                        "as uint8 so the engine computes the Q/DQ model's integers; fast keeps "
                        "int8 weights and the saturating kernels, as onnxruntime's "
                        "quantize_static models run (faster there, may lose accuracy; the "
                        "agreement check still applies). No effect where the kernels are exact")
    parser.add_argument("--calibInputs", metavar="FILE.npz", default=None,
                        help="real inputs (arrays named after the model inputs, batch first; "
                        "int64 token ids/masks for encoders) that calibrate the CPU "
                        "re-encoding and check the engine agrees with the ONNX (top-1 >= "
                        "99%%, or mean cosine >= 0.99 for embedding outputs)")
    parser.add_argument("--verbose", action="store_true", help="verbose logging")


# trtexec's deprecated spellings of --profilingVerbosity
_VERBOSITY_ALIASES = {"default": "layer_names_only", "verbose": "detailed"}


def profiling_verbosity(args: argparse.Namespace) -> str | None:
    """--profilingVerbosity with trtexec's old spellings mapped (None when not given)."""
    given = args.profilingVerbosity
    return _VERBOSITY_ALIASES.get(given, given) if given else None


def build_options_from_args(args: argparse.Namespace) -> Any:
    """BuildOptions from the shared flags."""
    from trtqat.engines import BuildOptions, parse_shapes

    def shapes(flag: str) -> dict:
        text = getattr(args, flag)
        return parse_shapes(text, f"--{flag}") if text else {}

    return BuildOptions(
        shapes=shapes("shapes"), min_shapes=shapes("minShapes"), opt_shapes=shapes("optShapes"),
        max_shapes=shapes("maxShapes"), fp16=args.fp16, int8=args.int8, best=args.best,
        fp8=args.fp8, int4=args.int4, strongly_typed=args.stronglyTyped,
        memory_pools=parse_mem_pools(args.memPoolSize) if args.memPoolSize else {},
        builder_optimization_level=args.builderOptimizationLevel,
        timing_cache=args.timingCacheFile, threads=args.threads,
        cuda_graph=bool(getattr(args, "cuda_graph", None)),
        providers=tuple(p.strip() for p in (args.providers or "cpu").split(",") if p.strip()),
        ort_prepare=args.ortPrepare or "auto", verbose=args.verbose,
        u8s8_guard=getattr(args, "cpuInt8", None) != "fast",
        profiling_verbosity=profiling_verbosity(args) or "layer_names_only",
        calib_feeds=load_calib_inputs(args.calibInputs, getattr(args, "onnx", None))
        if args.calibInputs else None)


def build_parser() -> argparse.ArgumentParser:
    """The ``trtqat-exec`` argument parser."""
    p = _Parser(prog=PROG, allow_abbrev=False,
                description="Build and benchmark an engine the way trtexec does.")
    model = p.add_argument_group("model")
    add_onnx(model, help="build from this ONNX model")
    model.add_argument("--loadEngine", metavar="FILE", help="load a saved engine")
    model.add_argument("--saveEngine", metavar="FILE", type=writable_file,
                       help="save the built engine")
    model.add_argument("--skipInference", action="store_true", help="build (and save) only")
    model.add_argument("--dumpLayerInfo", action="store_true", help="print the engine's layers")
    model.add_argument("--exportLayerInfo", metavar="FILE", help="the engine's layers as JSON")
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
    run.add_argument("--loadInputs", metavar="name:file,...",
                     help="input data: raw binary (as trtexec), .npy or .npz; others random")
    run.add_argument("--useSpinWait", action="store_true",
                     help="poll for query completion instead of blocking (TensorRT)")
    run.add_argument("--infStreams", type=int, metavar="N",
                     help="inference streams, each with its own context (TensorRT; default 1)")
    run.add_argument("--device", type=int, metavar="N", help="CUDA device (default 0)")
    run.add_argument("--exportTimes", metavar="FILE", type=writable_file,
                     help="per-query times as JSON")
    run.add_argument("--exportOutput", metavar="FILE", help="the outputs of one query as JSON")
    run.add_argument("--exportProfile", metavar="FILE",
                     help="per-layer profile as JSON (a separate profiled run)")
    run.add_argument("--separateProfileRun", action="store_true",
                     help="profile layers in a separate run after timing")
    run.add_argument("--dumpProfile", action="store_true", help="print the per-layer profile")
    add_trtexec_compat(p)
    return p


def _say(line: str = "") -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    """The trtexec flow: build or load, (save), time queries, print the summary."""
    from trtqat.engines import (
        BenchmarkSettings,
        OptionsError,
        backend_info,
        benchmark,
        build_engine,
        canonical_backend,
        load_engine,
    )
    from trtqat.engines.fileformat import sidecar_path
    from trtqat.engines.registry import default_backend

    for note in apply_trtexec_aliases(args):
        logging.getLogger("trtqat.exec").warning(note)
    if args.getPlanVersionOnly:
        return plan_version(args, _say)
    if bool(args.onnx) == bool(args.loadEngine):
        raise OptionsError("give exactly one of --onnx=MODEL.onnx and --loadEngine=FILE")
    check_engine_outputs(args, [("--saveEngine", "saveEngine"),
                                ("--exportTimes", "exportTimes"),
                                ("--exportOutput", "exportOutput"),
                                ("--exportProfile", "exportProfile"),
                                ("--exportLayerInfo", "exportLayerInfo")])
    if args.infStreams is not None and args.infStreams < 1:
        raise OptionsError(f"--infStreams must be >= 1, got {args.infStreams}")
    if args.device is not None and args.device < 0:
        raise OptionsError(f"--device must be >= 0, got {args.device}")
    backend = canonical_backend(args.backend) if args.backend else None
    options = build_options_from_args(args)
    settings = BenchmarkSettings(
        warmup_ms=args.warmUp, duration_s=args.duration, iterations=args.iterations,
        avg_runs=args.avgRuns, percentiles=parse_percentiles(args.percentile),
        data_transfers=args.transfers, cuda_graph=args.cuda_graph)
    if args.loadInputs and not args.skipInference:
        precheck_input_files(args)  # a typo fails now, not after a long build
    start = time.perf_counter()
    if args.onnx:
        backend = backend or default_backend()
        warn_ignored_flags(args, backend, loading=False)
        engine = build_engine(args.onnx, backend, options)
        verb, source = "built", args.onnx
    else:
        engine = load_engine(args.loadEngine, backend)
        # logging verbosity is this command's choice, not a property of the saved engine
        engine.header["build_options"] = dict(engine.header.get("build_options") or {},
                                              verbose=args.verbose)
        backend = engine.backend
        warn_ignored_flags(args, backend, loading=True)
        verb, source = "loaded", args.loadEngine
    _say(f"Engine {verb} in {time.perf_counter() - start:.3f} s from {source} "
         f"({backend} {engine.header.get('backend_version')})")
    if engine.header.get("precision"):  # what the ONNX holds (trtexec: "Precision: FP32+INT8")
        _say(f"Precision: {engine.header['precision']} (from the ONNX file)")
    if verb == "loaded":  # build_engine warns itself
        from trtqat.engines.ort_nodes import mostly_float_note
        from trtqat.engines.qformats import log_format_notes

        note = mostly_float_note(engine.header)
        if note:
            logging.getLogger("trtqat.exec").warning(note)
        log_format_notes(engine.header, logging.getLogger("trtqat.exec"))
    # check the run shapes and input files before writing anything
    feed = None if args.skipInference else make_feed(args, engine)
    if args.saveEngine:
        saved = engine.save(args.saveEngine)
        _say(f"Engine saved to {saved} (trtqat metadata in {sidecar_path(saved).name})")
    _layer_info(args, engine)
    if feed is None:
        return 0
    for name, array in feed.items():
        _say(f"Input {name}: {array.dtype} {'x'.join(map(str, array.shape))}")
    kwargs = backend_info(backend).runner_kwargs(
        device=args.device or 0, threads=args.threads, spin_wait=args.useSpinWait,
        streams=args.infStreams or 1)
    with engine.runner(**kwargs) as runner:
        _say("Starting inference")
        result = benchmark(runner, inputs=feed, settings=settings)
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
        _reports(args, runner, result, feed, settings.iterations)
    return 0


def warn_ignored_flags(args: argparse.Namespace, backend: str, loading: bool) -> None:
    """Log one warning per given flag that ``backend`` ignores."""
    from trtqat.cli.exec_notes import ignored_flag_notes

    for note in ignored_flag_notes(args, backend, loading):
        logging.getLogger("trtqat.exec").warning(note)


def _layer_info(args: argparse.Namespace, engine: Any) -> None:
    from trtqat.engines.trtexec_io import export_layer_info, layer_info_lines

    if not (args.dumpLayerInfo or args.exportLayerInfo):
        return
    info = engine.layer_info(profiling_verbosity(args))
    if args.dumpLayerInfo:
        _say("=== Layer Information ===")
        for line in layer_info_lines(info):
            _say(line)
    if args.exportLayerInfo:
        _say(f"Layer information exported to {export_layer_info(info, args.exportLayerInfo)}")


def _reports(args: argparse.Namespace, runner: Any, result: Any, feed: dict,
             iterations: int) -> None:
    """--exportTimes, --exportOutput and the profile (--separateProfileRun, --dumpProfile,
    --exportProfile), after the summary as in trtexec."""
    from trtqat.engines.trtexec_io import export_outputs, export_profile

    if args.exportTimes:
        _say(f"Times exported to {result.export_times(args.exportTimes)}")
    if args.exportOutput:
        _say(f"Outputs exported to {export_outputs(runner.infer(feed), args.exportOutput)}")
    if args.separateProfileRun or args.dumpProfile or args.exportProfile:
        layers = runner.profile_layers(feed, iterations)
        if args.separateProfileRun or args.dumpProfile:
            _print_profile(layers, iterations)
        if args.exportProfile:
            _say(f"Profile exported to {export_profile(layers, iterations, args.exportProfile)}")


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
    if dry_run_requested():
        print(dry_run_line(PROG, sys.argv[1:] if argv is None else argv))
        return 0
    # trtqat's own messages (precision notes, fallbacks) go to stderr as "[W] ..." lines
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(levelname).1s] %(message)s"))
    logger = logging.getLogger("trtqat")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    logger.propagate = False
    try:
        return run_guarded(PROG, lambda: run(args))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


if __name__ == "__main__":
    sys.exit(main())

"""trtexec's flags that ``trtqat-exec`` maps onto its own or accepts and ignores.

Old spellings (``--workspace``, ``--streams``, ``--buildOnly``) map onto the current flags,
``--getPlanVersionOnly`` prints the version that built ``--loadEngine``; every other trtexec
flag in :data:`UNSUPPORTED_FLAGS` is accepted, so that trtexec command lines carry over, and
named in one ``[W]`` line. A bare ``--threads`` (trtexec's multithreading switch) is dropped
with a ``[W]`` line too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from trtqat.cli.options import BARE_THREADS


def add_trtexec_compat(p: argparse.ArgumentParser) -> None:
    """The "trtexec aliases" and "other trtexec flags" groups of ``trtqat-exec``."""
    old = p.add_argument_group("trtexec aliases")
    old.add_argument("--workspace", type=float, metavar="MIB",
                     help="trtexec's old spelling of --memPoolSize=workspace:MIB")
    old.add_argument("--streams", type=int, metavar="N", help="old spelling of --infStreams")
    old.add_argument("--buildOnly", action="store_true", help="old spelling of --skipInference")
    other = p.add_argument_group(
        "other trtexec flags", "accepted so that trtexec command lines carry over; each one "
        "given is ignored with a [W] line")
    for flag in UNSUPPORTED_FLAGS:
        other.add_argument(f"--{flag}", nargs="?", const=True, default=None, metavar="V",
                           help=argparse.SUPPRESS)
    other.add_argument("--getPlanVersionOnly", action="store_true",
                       help="with --loadEngine: print the backend version the engine was "
                       "built with, then exit")


# trtexec flags trtqat-exec accepts and ignores (named in one [W] line each)
UNSUPPORTED_FLAGS = (
    "noTF32", "bf16", "inputIOFormats", "outputIOFormats", "sparsity",
    "allowGPUFallback", "useDLACore", "noBuilderCache", "noCompilationCache", "dumpOutput",
    "dumpRawBindingsToFile", "idleTime", "sleepTime", "exposeDMA", "useManagedMemory",
    "precisionConstraints", "layerPrecisions", "layerOutputTypes", "layerDeviceTypes",
    "tacticSources", "maxAuxStreams", "persistentCacheRatio", "versionCompatible", "refit",
    "safe", "avgTiming", "minTiming", "maxTiming", "timeDeserialize", "timeRefit",
    "consistency", "explicitBatch", "plugins", "staticPlugins", "setPluginsToSerialize",
    "preview", "hardwareCompatibilityLevel", "profile", "allocationStrategy",
    "weightStreaming", "weightStreamingBudget", "directIO", "useRuntime", "leanDLLPath",
    "excludeLeanRuntime", "tempdir", "tempfileControls", "markDebug", "maxTactics",
    "errorOnTimingCacheMiss", "calib", "restricted", "stripWeights", "saveDebugTensors",
    "allowWeightStreaming", "dumpRefit",
)


def apply_trtexec_aliases(args: argparse.Namespace) -> list[str]:
    """Map trtexec's old spellings (--workspace, --streams, --buildOnly) onto their current
    flags, as trtexec does, and return one warning line per ignored trtexec flag given."""
    from trtqat.engines.errors import OptionsError

    if args.workspace is not None:
        if not (math.isfinite(args.workspace) and args.workspace > 0):
            raise OptionsError(f"--workspace must be a finite number > 0 (MiB), got "
                               f"{args.workspace:g}")
        pools = [args.memPoolSize] if args.memPoolSize else []
        args.memPoolSize = ",".join(pools + [f"workspace:{args.workspace:g}"])
    if args.streams is not None:
        if args.infStreams is not None and args.infStreams != args.streams:
            raise OptionsError("--streams is the old spelling of --infStreams; give only one")
        args.infStreams = args.streams
    args.skipInference = args.skipInference or args.buildOnly
    return bare_threads_note(args) + [
        f"--{flag} is not supported by trtqat-exec; ignored"
        for flag in dict.fromkeys(UNSUPPORTED_FLAGS) if getattr(args, flag) is not None]


def bare_threads_note(args: argparse.Namespace) -> list[str]:
    """Drop a bare ``--threads`` (trtexec's multithreading switch) with one warning line."""
    if getattr(args, "threads", None) != BARE_THREADS:
        return []
    args.threads = None
    return ["--threads without a number is trtexec's multithreading switch, which trtqat "
            "does not have; ignored (--threads=N sets ONNX Runtime's intra-op threads)"]


def plan_version(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """trtexec's --getPlanVersionOnly: the version that built --loadEngine, nothing run."""
    from trtqat.engines import OptionsError
    from trtqat.engines.fileformat import read_engine_files
    from trtqat.engines.registry import backend_for_file_kind, backend_info

    if not args.loadEngine or args.onnx:
        raise OptionsError("--getPlanVersionOnly reads the engine given by --loadEngine=FILE "
                           "(and nothing else)")
    found = read_engine_files(args.loadEngine)
    header = found.header or {}
    backend = str(header.get("backend") or backend_for_file_kind(found.kind))
    version = header.get("backend_version") or "unknown (the engine has no trtqat sidecar)"
    say(f"Plan was created with {backend_info(backend).title} version {version}")
    return 0

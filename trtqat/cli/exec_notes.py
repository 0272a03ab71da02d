"""Warnings for ``trtqat-exec``/``trtqat build`` flags that the chosen backend ignores.

trtexec's flags are accepted on every backend so that command lines carry over; a flag the
backend cannot honour is named in one ``[W]`` line instead of being dropped silently. What
each backend ignores comes from its entry in ``trtqat.engines.registry``.
"""

from __future__ import annotations

import argparse

from trtqat.engines.registry import backend_info

# build-only flags (argparse dest = flag name): a loaded engine keeps what it was built with
BUILD_FLAGS = ("minShapes", "optShapes", "maxShapes", "fp16", "int8", "fp8", "int4", "best",
               "stronglyTyped",
               "memPoolSize", "builderOptimizationLevel", "timingCacheFile", "providers",
               "ortPrepare", "cpuInt8", "calibInputs", "profilingVerbosity")


# argparse dests that are not spelled like their flag
FLAG_NAMES = {"cuda_graph": "useCudaGraph"}


def _given(args: argparse.Namespace, dest: str) -> bool:
    value = getattr(args, dest, None)
    return value is not None and value is not False


def ignored_flag_notes(args: argparse.Namespace, backend: str, loading: bool) -> list[str]:
    """One line per given flag that ``backend`` ignores (``loading``: with --loadEngine)."""
    notes = []
    if loading:
        notes += [f"--{dest} is a build option; the engine from {args.loadEngine} keeps what it "
                  "was built with, so it is ignored" for dest in BUILD_FLAGS
                  if _given(args, dest)]
    for dest, applies, text in backend_info(backend).ignored_flags(vars(args)):
        if applies and _given(args, dest) and not (loading and dest in BUILD_FLAGS):
            notes.append(f"--{FLAG_NAMES.get(dest, dest)} {text}")
    return notes

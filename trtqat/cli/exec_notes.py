"""Warnings for ``trtqat-exec``/``trtqat build`` flags that the chosen backend ignores.

trtexec's flags are accepted on every backend so that command lines carry over; a flag the
backend cannot honour is named in one ``[W]`` line instead of being dropped silently.
"""

from __future__ import annotations

import argparse

# build-only flags (argparse dest = flag name): a loaded engine keeps what it was built with
BUILD_FLAGS = ("minShapes", "optShapes", "maxShapes", "fp16", "int8", "best", "stronglyTyped",
               "memPoolSize", "builderOptimizationLevel", "timingCacheFile", "providers",
               "ortPrepare", "calibInputs", "profilingVerbosity")
_ORT = "is ignored by the ONNX Runtime backend"
_TRT_ONLY = f"{_ORT} (TensorRT only; ORT's TensorRT provider takes it with --providers=tensorrt)"


def _given(args: argparse.Namespace, dest: str) -> bool:
    value = getattr(args, dest, None)
    return value is not None and value is not False


def _ignored(args: argparse.Namespace, backend: str) -> list[tuple[str, bool, str]]:
    """(flag dest, applies?, what to say) for the flags ``backend`` ignores or reinterprets."""
    if backend != "ort":
        why = "is an ONNX Runtime option; the TensorRT backend ignores it"
        return [(dest, True, why) for dest in ("threads", "providers", "ortPrepare",
                                               "calibInputs")]
    providers = (getattr(args, "providers", None) or "cpu").split(",")
    trt_ep = "tensorrt" in providers
    gpu = trt_ep or "cuda" in providers
    return [
        ("timingCacheFile", not trt_ep, _TRT_ONLY),
        ("memPoolSize", not trt_ep, _TRT_ONLY),
        ("builderOptimizationLevel", not trt_ep, "is a TensorRT builder setting; on ONNX "
         "Runtime it only picks the graph optimization level (0 disabled, 1 basic, "
         "2 extended, 3-5 all)"),
        ("stronglyTyped", True, f"{_ORT} (TensorRT only: ONNX Runtime keeps the ONNX types)"),
        ("useSpinWait", True, f"{_ORT} (it runs synchronously: there is nothing to wait for)"),
        ("infStreams", (getattr(args, "infStreams", None) or 1) > 1,
         f"{_ORT} (it runs one query at a time; --threads sets intra-op threads)"),
        ("device", not gpu, f"{_ORT} with the CPU provider (use --providers=cuda)"),
    ]


def ignored_flag_notes(args: argparse.Namespace, backend: str, loading: bool) -> list[str]:
    """One line per given flag that ``backend`` ignores (``loading``: with --loadEngine)."""
    notes = []
    if loading:
        notes += [f"--{dest} is a build option; the engine from {args.loadEngine} keeps what it "
                  "was built with, so it is ignored" for dest in BUILD_FLAGS
                  if _given(args, dest)]
    for dest, applies, text in _ignored(args, backend):
        if applies and _given(args, dest) and not (loading and dest in BUILD_FLAGS):
            notes.append(f"--{dest} {text}")
    return notes

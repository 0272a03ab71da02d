"""``trtqat build``: build an engine from an ONNX file and save it, without benchmarking."""

from __future__ import annotations

import argparse
import time
from typing import Any

from trtqat.cli.exec_cmd import add_build_arguments, build_options_from_args, warn_ignored_flags
from trtqat.cli.validate import check_engine_outputs, writable_file


def register(subparsers: Any) -> None:
    """Add the ``build`` subcommand."""
    parser = subparsers.add_parser(
        "build", help="build an engine (ONNX Runtime or TensorRT) from an ONNX file",
        description="Build an engine from an ONNX file and save it. Benchmark it with "
        "'trtqat-exec --loadEngine=FILE'.")
    parser.add_argument("--onnx", required=True, metavar="FILE", help="the ONNX model")
    parser.add_argument("--out", required=True, metavar="FILE", type=writable_file,
                        help="engine file to write")
    add_build_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build, save, print one summary line."""
    from trtqat.engines import builder_class, canonical_backend
    from trtqat.engines.fileformat import sidecar_path
    from trtqat.engines.registry import default_backend

    check_engine_outputs(args, [("--out", "out")])
    backend = canonical_backend(args.backend or default_backend())
    warn_ignored_flags(args, backend, loading=False)
    start = time.perf_counter()
    engine = builder_class(backend)(build_options_from_args(args)).build(args.onnx)
    path = engine.save(args.out)
    inputs = ", ".join(spec.describe() for spec in engine.inputs)
    print(f"built {path} (metadata in {sidecar_path(path).name}; {backend} "
          f"{engine.header.get('backend_version')}) in "
          f"{time.perf_counter() - start:.2f} s; inputs: {inputs}")
    return 0

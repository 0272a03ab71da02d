"""``trtqat build``: build an engine from an ONNX file and save it, without benchmarking."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from trtqat.cli import options as O
from trtqat.cli.exec_cmd import add_build_arguments, build_options_from_args, warn_ignored_flags
from trtqat.cli.exec_flags import bare_threads_note
from trtqat.cli.validate import check_engine_outputs

SUMMARY = "build an engine (ONNX Runtime or TensorRT) from an ONNX file"
DESCRIPTION = ("Build an engine from an ONNX file and save it. Benchmark it with "
               "'trtqat-exec --loadEngine=FILE'.")


def register(subparsers: Any) -> None:
    """Add the ``build`` subcommand."""
    parser = O.command(subparsers, "build", SUMMARY, DESCRIPTION)
    O.add_onnx(parser, required=True)
    O.add_out(parser, None, "engine file to write", metavar="FILE", file=True, required=True)
    add_build_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build, save, print one summary line."""
    from trtqat.engines import build_engine, canonical_backend
    from trtqat.engines.fileformat import sidecar_path
    from trtqat.engines.registry import default_backend

    check_engine_outputs(args, [("--out", "out")])
    for note in bare_threads_note(args):
        logging.getLogger("trtqat.build").warning(note)
    backend = canonical_backend(args.backend or default_backend())
    warn_ignored_flags(args, backend, loading=False)
    start = time.perf_counter()
    engine = build_engine(args.onnx, backend, build_options_from_args(args), out=args.out)
    path = engine.path
    inputs = ", ".join(spec.describe() for spec in engine.inputs)
    print(f"built {path} (metadata in {sidecar_path(path).name}; {backend} "
          f"{engine.header.get('backend_version')}) in "
          f"{time.perf_counter() - start:.2f} s; inputs: {inputs}")
    return 0

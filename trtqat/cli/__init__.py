"""The ``trtqat`` command: one subcommand per library verb.

Each subcommand lives in ``trtqat/cli/cmd_<name>.py`` and exposes ``register(subparsers)``;
heavy imports happen inside the command, so ``trtqat --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from trtqat.cli.guard import run_guarded
from trtqat.cli.parsing import (
    SubcommandParser,
    add_common_options,
    dry_run_line,
    dry_run_requested,
)
from trtqat.cli.validate import OneLineParser

# Order shown in --help. A name here is a module trtqat.cli.cmd_<name>.
COMMANDS = ["demo", "train", "calibrate", "qat", "export", "lint", "build", "compare",
            "sensitivity"]
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def version_text() -> str:
    """trtqat, torch and onnxruntime versions, and the fake-quant kernels of each device."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from trtqat.quant import _kernels

    def dist(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    try:
        import onnxruntime

        ort = f"onnxruntime {onnxruntime.__version__}"
    except ImportError:
        ort = "onnxruntime not installed (pip install 'trtqat[ort]' or 'trtqat[ort-gpu]')"
    report = _kernels.kernel_report()
    cuda = "CUDA device visible" if torch.cuda.is_available() else "no CUDA device visible"
    return "\n".join([
        f"trtqat {dist('trtqat')}",
        f"torch {torch.__version__}, {ort}",
        f"fake-quant kernels, CPU: {report['cpu']}",
        f"fake-quant kernels, CUDA ({cuda}): {report['cuda']}",
    ])


class _VersionAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trtqat`` with every available subcommand."""
    parser = OneLineParser(
        prog="trtqat",
        description="Quantization-aware training to fast INT8 engines: train, calibrate (PTQ), "
        "fine-tune (QAT), export Q/DQ ONNX, build and benchmark engines, compare.",
    )
    parser.add_argument("--log-level", default="WARNING", choices=LOG_LEVELS,
                        help="logging verbosity (default WARNING; also accepted after COMMAND)")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print the versions and the fake-quant kernels in use, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubcommandParser)
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"trtqat.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trtqat.cli.cmd_{name}":
                continue  # not part of this build yet
            raise
        module.register(sub)
    for subparser in sub.choices.values():
        add_common_options(subparser, LOG_LEVELS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trtqat`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if dry_run_requested():
        print(dry_run_line("trtqat", sys.argv[1:] if argv is None else argv))
        return 0
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    from trtqat.runopts import trusting_model_files

    with trusting_model_files(getattr(args, "trust_model_file", False)):
        return run_guarded(f"trtqat {args.command}", lambda: _run(args))


def _run(args: argparse.Namespace) -> int | None:
    """``--threads`` applied before the command does any work, then the command."""
    from trtqat.threads import apply_threads

    threads = getattr(args, "threads", None)
    if threads is not None and threads > 0:  # BARE_THREADS: the command warns and drops it
        apply_threads(threads, torch=getattr(args, "threads_torch", True))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

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

from trtqat.cli.validate import OneLineParser
from trtqat.errors import TrtqatError

# Order shown in --help. A name here is a module trtqat.cli.cmd_<name>.
COMMANDS = ["demo", "train", "calibrate", "qat", "export", "lint", "build", "compare",
            "sensitivity"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trtqat`` with every available subcommand."""
    parser = OneLineParser(
        prog="trtqat",
        description="Quantization-aware training to fast INT8 engines: train, calibrate (PTQ), "
        "fine-tune (QAT), export Q/DQ ONNX, build and benchmark engines, compare.",
    )
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging verbosity")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"trtqat.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trtqat.cli.cmd_{name}":
                continue  # not part of this build yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trtqat`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = args.func(args)
    except TrtqatError as exc:
        print(f"trtqat {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"trtqat {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

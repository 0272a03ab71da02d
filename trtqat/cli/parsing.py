"""The ``trtqat`` subcommand parser: clean default texts in --help, the options every
subcommand accepts after its name (``trtqat train --log-level DEBUG ...``), and the
parse-only mode (``TRTQAT_DRY_RUN=1``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from trtqat.cli.validate import OneLineParser

DRY_RUN_ENV = "TRTQAT_DRY_RUN"


def dry_run_requested() -> bool:
    """True when ``TRTQAT_DRY_RUN`` is set (not empty/0/false): commands parse their
    arguments and exit without running (how docker/README.md's examples are tested)."""
    return os.environ.get(DRY_RUN_ENV, "").strip().lower() not in ("", "0", "false", "no")


def dry_run_line(prog: str, argv: Any) -> str:
    """What a dry run prints: the command line it checked."""
    return f"{prog}: arguments OK ({DRY_RUN_ENV} is set, nothing run): {' '.join(argv)}"


def _shown_default(default: Any) -> str | None:
    """How --help shows a default: None for nothing to show, lists comma-joined."""
    if default is None or isinstance(default, bool) or default in ((), [], {}, ""):
        return None
    if isinstance(default, (tuple, list)):
        return ",".join(map(str, default))
    return None if default is argparse.SUPPRESS else str(default)


class LazyHelp(str):
    """A help text completed only when ``--help`` is printed: ``complete()`` returns the
    full text (e.g. read from the family registry, whose import takes seconds, so building
    the parser stays fast); until then the text itself is shown."""

    complete: Callable[[], str]

    def __new__(cls, text: str, complete: Callable[[], str]) -> LazyHelp:
        obj = super().__new__(cls, text)
        obj.complete = complete
        return obj


class SubcommandParser(OneLineParser):
    """A one-line-error parser whose help never shows Python reprs such as ``(default: ())``."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        formatter = super()._get_formatter()
        original = formatter._get_help_string

        def help_string(action: argparse.Action) -> str:
            if isinstance(action.help, LazyHelp):
                action.help = action.help.complete()
            text = original(action)
            plain = action.help or ""
            if text == plain or "%(default)" in plain:
                return text  # the formatter adds no default here, or the help places it
            shown = _shown_default(action.default)
            if shown is None:
                return plain
            return text.replace("%(default)s", shown.replace("%", "%%"))

        formatter._get_help_string = help_string  # type: ignore[method-assign]
        return formatter


def add_common_options(parser: argparse.ArgumentParser, choices: list[str]) -> None:
    """``--log-level`` on a subcommand, so it may follow the subcommand's name; it overrides
    the one given before the name only when given (SUPPRESS default)."""
    if "--log-level" in parser._option_string_actions:
        return
    parser.add_argument("--log-level", choices=choices, default=argparse.SUPPRESS,
                        help="logging verbosity (also accepted before the subcommand)")

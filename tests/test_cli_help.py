"""The ``trtqat`` command line: --log-level after the subcommand, help without Python reprs."""

from __future__ import annotations

import re

import pytest

from trtqat.cli import build_parser

PARSER = build_parser()
SUBCOMMANDS = sorted(next(a for a in PARSER._actions if a.dest == "command").choices)
REPR = re.compile(r"\(default: (\(|\[|\{|None|False|True|'|\")|\(\)|\[\]|\{\}")


@pytest.mark.parametrize("argv, level", [
    (["lint", "m.onnx"], "WARNING"),
    (["--log-level", "INFO", "lint", "m.onnx"], "INFO"),
    (["lint", "--log-level", "DEBUG", "m.onnx"], "DEBUG"),
    (["--log-level", "INFO", "lint", "m.onnx", "--log-level=ERROR"], "ERROR"),
])
def test_log_level_before_or_after_the_subcommand(argv: list[str], level: str) -> None:
    assert PARSER.parse_args(argv).log_level == level


def test_every_subcommand_takes_log_level() -> None:
    assert len(SUBCOMMANDS) >= 8
    for name in SUBCOMMANDS:
        assert "--log-level" in PARSER._subparsers._group_actions[0].choices[name].format_help()


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_help_has_no_python_reprs(name: str) -> None:
    text = PARSER._subparsers._group_actions[0].choices[name].format_help()
    assert not REPR.search(text), REPR.search(text)


def test_limit_batches_spelling_is_shared_by_sensitivity() -> None:
    # calibrate/qat/train spell it --limit-batches; sensitivity takes that spelling too
    args = PARSER.parse_args(["sensitivity", "--checkpoint", "c.pt", "--limit-batches", "2"])
    assert args.batches == 2

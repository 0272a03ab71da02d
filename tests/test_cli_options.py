"""Options shared by ``trtqat`` subcommands are one option: the same short form and type in
every subcommand's parser, and spelled (``add_argument``) only in ``trtqat/cli/options.py``."""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

import pytest

import trtqat.cli
from trtqat.cli import build_parser

CLI_DIR = Path(trtqat.cli.__file__).parent
PROBES = ("-1", "0", "1", "2", "1.5", "nan", "8x8", "a,b")
# the short forms the README and the tests use
SHORT = {"--out": "-o", "--model": "-m", "--checkpoint": "-c", "--batch-size": "-b",
         "--workers": "-j"}
# an option whose type differs on purpose: (option, subcommand) -> the type's name
OTHER_TYPE = {("--out", "build"): "writable_file"}  # build writes one engine file, not a folder
# the same spelling for another concept, defined where it is used: (file, option)
HOMONYMS = {
    ("cmd_lint.py", "--strict"),      # fail on lint warnings (data groups: on unreadable images)
    ("cmd_compare.py", "--onnx"),     # several ONNX files to compare (build: the one to build)
    ("exec_cmd.py", "--device"),      # trtexec's CUDA device ordinal (trtqat: auto/cpu/cuda:N)
    ("exec_cmd.py", "--duration"),    # trtexec's seconds, 0 allowed (compare/demo: > 0)
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _type_key(kind: object) -> tuple:
    """A type by its name and by what it makes of a few strings (bounds included)."""
    if kind is None:
        return (None,)

    def outcome(text: str) -> str:
        try:
            return repr(kind(text))  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            return "refused"

    return (getattr(kind, "__qualname__", repr(kind)), tuple(outcome(t) for t in PROBES))


def _occurrences() -> dict[str, list[tuple[str, argparse.Action]]]:
    """Long option -> (subcommand, action) for every option of every subcommand."""
    found: dict[str, list[tuple[str, argparse.Action]]] = defaultdict(list)
    for name, sub in _subparsers().items():
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option not in ("--help", "--log-level"):
                    found[option].append((name, action))
    return found


OCCURRENCES = _occurrences()
SHARED = sorted(o for o, where in OCCURRENCES.items() if len(where) > 1)


def test_the_walk_sees_the_shared_options() -> None:
    assert len(_subparsers()) >= 9
    for option in ("--out", "--model", "--checkpoint", "--data", "--image-size", "--device",
                   "--no-progress", "--skip-layers", "--max-length", "--batch-size"):
        assert option in SHARED, option


@pytest.mark.parametrize("option", SHARED)
def test_shared_option_is_one_option(option: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # path validators probe the current folder
    shorts, kinds, classes = {}, {}, {}
    for name, action in OCCURRENCES[option]:
        if (f"cmd_{name}.py", option) in HOMONYMS:
            continue
        shorts[name] = tuple(s for s in action.option_strings if not s.startswith("--"))
        expected = OTHER_TYPE.get((option, name))
        if expected:
            assert getattr(action.type, "__name__", None) == expected, (option, name)
            continue
        kinds[name] = _type_key(action.type)
        classes[name] = type(action).__name__
    assert len(set(shorts.values())) == 1, f"{option}: short forms differ: {shorts}"
    assert len(set(kinds.values())) == 1, f"{option}: types differ: {kinds}"
    assert len(set(classes.values())) == 1, f"{option}: actions differ: {classes}"
    if option in SHORT:
        assert set(shorts.values()) == {(SHORT[option],)}, (option, shorts)


def _defined_options() -> dict[str, set[str]]:
    """Long option -> the files of trtqat/cli that spell it in an add_argument call."""
    where: dict[str, set[str]] = defaultdict(set)
    for path in sorted(CLI_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        where[arg.value].add(path.name)
    return where


def test_shared_options_are_spelled_once() -> None:
    where = _defined_options()
    assert "options.py" in where["--out"]
    for option in SHARED:
        files = {f for f in where.get(option, set()) if (f, option) not in HOMONYMS}
        assert files == {"options.py"}, f"{option} is spelled in {sorted(files)}"


@pytest.mark.parametrize("argv, dest, value", [
    (["export", "-c", "c.pt"], "checkpoint", "c.pt"),
    (["export", "-c", "c.pt", "--seq-len", "64"], "max_length", 64),
    (["compare", "--seq-len", "64", "-m", "minilm", "-o", "eng"], "max_length", 64),
    (["sensitivity", "-c", "c.pt", "--batches", "3"], "batches", 3),
    (["build", "--onnx", "m.onnx", "-o", "m.engine"], "out", "m.engine"),
    (["export", "-c", "c.pt", "--no-fold-bn", "--no-validate"], "fold_bn", False),
])
def test_spellings(argv: list[str], dest: str, value: object, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert getattr(build_parser().parse_args(argv), dest) == value

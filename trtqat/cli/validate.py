"""Argument checks at the command-line boundary, defined once for every command.

Each ``type=`` validator turns a string into a value or raises
:class:`argparse.ArgumentTypeError` with one line that says what is expected (range, unit)
and what was given; :class:`OneLineParser` prints it as one line. Numbers must be finite.
Paths are checked for their kind and for being writable before any work starts.

    p.add_argument("--lr", type=finite_float(gt=0, unit="learning rate"))
    p.add_argument("--epochs", type=positive_int)
    p.add_argument("--out", type=writable_dir)
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from trtqat.out_paths import check_output_file


class BadValue(argparse.ArgumentTypeError):
    """A value refused by one of these validators: bad input, exit status 1."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line. A value refused by a validator here exits 1, like
    every other bad input; argparse's own usage errors (unknown flag, missing argument,
    invalid choice) keep its exit status 2."""

    _bad_value = False

    def _get_value(self, action: argparse.Action, arg_string: str) -> object:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            self._bad_value = isinstance(exc.__context__, BadValue)
            raise

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        """argparse's, except that an unknown option after a subcommand is reported by that
        subcommand (``see 'trtqat train --help'``), not by the top-level command."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self._subcommand_parser(ns).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def _subcommand_parser(self, ns: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the subcommand ``ns`` ran (``self`` when there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(ns, action.dest, None) or "")
                if sub is not None:
                    return sub._subcommand_parser(ns) if isinstance(sub, OneLineParser) else sub
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, then every path argument (:data:`PATH_DESTS`) checked for names the
        file system cannot hold (:func:`path_problem`), as one line, exit 1."""
        namespace, extras = super().parse_known_args(args, namespace)
        for dest in sorted(PATH_DESTS & set(vars(namespace))):
            problem = path_problem(getattr(namespace, dest))
            if problem:
                self._bad_value = True
                flags = [a.option_strings for a in self._actions if a.dest == dest]
                flag = flags[0][0] if flags and flags[0] else f"--{dest.replace('_', '-')}"
                self.error(f"argument {flag}: {problem}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        self.exit(1 if self._bad_value else 2,
                  f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# the arguments (by dest) of every command that name files or folders
PATH_DESTS = frozenset({
    "out", "checkpoint", "model", "onnx", "data", "run", "runs", "fp32_out", "export_dir",
    "weights", "loadEngine", "saveEngine", "exportTimes", "exportOutput", "exportProfile",
    "exportLayerInfo", "timingCacheFile", "calibInputs", "loadInputs"})
NAME_MAX, PATH_MAX = 255, 4096  # bytes, Linux's (and most file systems') limits


def path_problem(value: Any) -> str | None:
    """Why ``value`` (a path, or a list of them) cannot name a file here: a path over
    PATH_MAX bytes or a component over NAME_MAX bytes (None: fine)."""
    for text in value if isinstance(value, (list, tuple)) else [value]:
        if not isinstance(text, str):
            continue
        size = len(os.fsencode(text))
        if size >= PATH_MAX:
            return (f"the path {text[:40]}... is {size} bytes long, more than the system allows "
                    f"({PATH_MAX - 1}); use a shorter path")
        for part in text.split(os.sep):
            size = len(os.fsencode(part))
            if size > NAME_MAX:
                return (f"the name {part[:40]}... is {size} bytes long, more than a file name "
                        f"may be ({NAME_MAX} bytes); use a shorter name")
    return None


def _fail(expected: str, text: str) -> NoReturn:
    raise BadValue(f"expected {expected}, got {text!r}")


def int_range(lo: int | None = None, hi: int | None = None, unit: str = ""
              ) -> Callable[[str], int]:
    """A validator of integers in ``[lo, hi]`` (either bound may be None)."""
    bounds = (f">= {lo}" if hi is None else f"in {lo}..{hi}") if lo is not None else (
        f"<= {hi}" if hi is not None else "")
    expected = " ".join(filter(None, ["an integer", bounds, f"({unit})" if unit else ""]))

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            _fail(expected, text)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            _fail(expected, text)
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


positive_int = int_range(1)
non_negative_int = int_range(0)
seed_int = int_range(0, 2**32 - 1, "random seed")
threads_int = int_range(1, unit="CPU threads")


def finite_float(ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None, unit: str = "") -> Callable[[str], float]:
    """A validator of finite floats within the given bounds (``ge``: >=, ``gt``: >, ...)."""
    parts = [f"{op} {v:g}" for op, v in ((">=", ge), (">", gt), ("<=", le), ("<", lt))
             if v is not None]
    expected = " ".join(filter(None, ["a finite number", " and ".join(parts),
                                      f"({unit})" if unit else ""]))

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            _fail(expected, text)
        if not math.isfinite(value):
            _fail(expected, text)
        if ((ge is not None and value < ge) or (gt is not None and value <= gt)
                or (le is not None and value > le) or (lt is not None and value >= lt)):
            _fail(expected, text)
        return value

    parse.__name__ = "float"
    return parse


probability = finite_float(ge=0.0, le=1.0, unit="a fraction")


def finite_float_list(gt: float | None = None, example: str = "0.485,0.456,0.406"
                      ) -> Callable[[str], tuple[float, ...]]:
    """A validator of comma-separated finite floats (each ``> gt`` when given)."""
    expected = ("comma-separated finite numbers" + (f" > {gt:g}" if gt is not None else "")
                + f", e.g. {example}")

    def parse(text: str) -> tuple[float, ...]:
        try:
            values = tuple(float(t) for t in text.split(",") if t.strip())
        except ValueError:
            _fail(expected, text)
        if not values or not all(math.isfinite(v) and (gt is None or v > gt) for v in values):
            _fail(expected, text)
        return values

    parse.__name__ = "float list"
    return parse


def int_list(text: str) -> tuple[int, ...]:
    """``1,32`` -> (1, 32): comma-separated integers >= 1."""
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        _fail("comma-separated integers >= 1, e.g. 1,32", text)
    if not values or min(values) < 1:
        _fail("comma-separated integers >= 1, e.g. 1,32", text)
    return values


def _check_path(text: str) -> None:
    """:class:`BadValue` for a path the file system cannot hold (see :func:`path_problem`)."""
    problem = path_problem(text)
    if problem:
        raise BadValue(problem)


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, what: str) -> None:
    """``path`` (a folder, existing or not) can hold new files."""
    base = _nearest_existing(path)
    if not base.is_dir():
        raise BadValue(f"{path} is below {base}, which is a file, not a "
                       f"folder; choose another {what}")
    try:  # a real probe: access() says yes to root on a read-only file system
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as exc:
        raise BadValue(f"cannot write to {base} ({exc.strerror or exc}); "
                       f"choose a writable {what}") from None


def writable_dir(text: str) -> str:
    """A folder that exists or can be created, and that can be written to."""
    _check_path(text)
    path = Path(text)
    if not text:
        raise BadValue("expected a folder path, got ''")
    if path.exists() and not path.is_dir():
        raise BadValue(f"{path} is a file, not a folder; choose another "
                       "folder")
    _check_creatable(path, "folder")
    return text


def writable_file(text: str) -> str:
    """A file path whose folder exists or can be created and written to (not a folder)."""
    _check_path(text)
    path = Path(text)
    if not text or path.is_dir() or text.endswith(os.sep):
        raise BadValue(f"{path} is a folder; give a file path, e.g. "
                       f"{path / 'model.engine'}")
    _check_creatable(path.parent, "output file path")
    return text


def existing_file(text: str) -> str:
    """A path that names an existing regular file."""
    _check_path(text)
    path = Path(text)
    if path.is_dir():
        raise BadValue(f"{path} is a folder, not a file; give the file")
    if not path.is_file():
        raise BadValue(f"{path} does not exist; check the path")
    return text


def existing_dir(text: str) -> str:
    """A path that names an existing folder."""
    _check_path(text)
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise BadValue(f"{path} is a file, not a folder; give the folder")
    if not path.is_dir():
        raise BadValue(f"{path} does not exist; check the path")
    return text


# the report each flag writes (trtqat.engines.trtexec_io.report_kind) and its name in messages
REPORTS = {"exportTimes": "times", "exportOutput": "outputs", "exportProfile": "profile",
           "exportLayerInfo": "layers"}
ENGINE_OUTPUTS = ("saveEngine", "out")


def _is_report(kind: str) -> Callable[[Path], bool]:
    def check(path: Path) -> bool:
        from trtqat.engines.trtexec_io import report_kind

        return report_kind(path) == kind

    return check


def check_engine_outputs(args: argparse.Namespace, outputs: Iterable[tuple[str, str]]) -> None:
    """Refuse engine outputs (``(flag, attribute)``) that are an input of the command, the
    same file as another output, or an existing file that is not an earlier output of the
    same kind, recognised by its content: an engine (with a trtqat sidecar beside it, whose
    own path must be free or a trtqat sidecar too), or the trtexec report the flag writes
    (``--exportTimes``, ``--exportOutput``, ``--exportProfile``, ``--exportLayerInfo``)."""
    from trtqat.engines.out_check import check_engine_output
    from trtqat.out_paths import Claims

    inputs = [(f"--{name}", getattr(args, name, None))
              for name in ("onnx", "loadEngine", "calibInputs", "timingCacheFile")]
    cache = getattr(args, "timingCacheFile", None)
    if cache:  # read and then rewritten by TensorRT: it may be no other input
        check_output_file(cache, "--timingCacheFile", inputs[:3], lambda _: True,
                          "a timing cache")
    claims = Claims()
    for flag, attr in outputs:
        value = getattr(args, attr, None)
        if not value:
            continue
        if attr in REPORTS:
            claims.claim(flag, value)
            check_output_file(value, flag, inputs, _is_report(REPORTS[attr]),
                              f"an earlier {flag} file ({REPORTS[attr]} JSON)")
            continue
        check_engine_output(value, flag, inputs, claims)

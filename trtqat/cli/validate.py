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
from typing import NoReturn

from trtqat.errors import TrtqatError


class OutputPathError(TrtqatError, ValueError):
    """An output path would destroy an input or a file that is not ours."""


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

    def error(self, message: str) -> NoReturn:
        self.exit(1 if self._bad_value else 2,
                  f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def int_list(text: str) -> tuple[int, ...]:
    """``1,32`` -> (1, 32): comma-separated integers >= 1."""
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        _fail("comma-separated integers >= 1, e.g. 1,32", text)
    if not values or min(values) < 1:
        _fail("comma-separated integers >= 1, e.g. 1,32", text)
    return values


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
    path = Path(text)
    if not text or path.is_dir() or text.endswith(os.sep):
        raise BadValue(f"{path} is a folder; give a file path, e.g. "
                       f"{path / 'model.engine'}")
    _check_creatable(path.parent, "output file path")
    return text


def existing_file(text: str) -> str:
    """A path that names an existing regular file."""
    path = Path(text)
    if path.is_dir():
        raise BadValue(f"{path} is a folder, not a file; give the file")
    if not path.is_file():
        raise BadValue(f"{path} does not exist; check the path")
    return text


def existing_dir(text: str) -> str:
    """A path that names an existing folder."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise BadValue(f"{path} is a file, not a folder; give the folder")
    if not path.is_dir():
        raise BadValue(f"{path} does not exist; check the path")
    return text


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_file(out: str | os.PathLike, flag: str, inputs: Iterable[tuple[str, object]],
                      is_ours: Callable[[Path], bool], kind: str) -> None:
    """Refuse an output ``out`` that is one of the ``(flag, path)`` inputs, or an existing
    file that ``is_ours`` does not recognise as an earlier output of the same kind."""
    path = Path(out)
    for in_flag, value in inputs:
        if value and (_same_file(path, Path(str(value)))
                      or path.absolute() == Path(str(value)).absolute()):
            raise OutputPathError(f"{flag} {path} is also the input {in_flag}: writing it "
                                  f"would destroy the input; choose another {flag}")
    if path.is_file() and not is_ours(path):
        raise OutputPathError(f"{flag} {path} exists and is not {kind}: trtqat does not "
                              "overwrite other files; delete it or choose another "
                              f"{flag}")


def is_engine_file(path: Path) -> bool:
    """An earlier engine artifact: a trtqat engine file, a TensorRT plan ('ftrt' magic), or
    a file with a sidecar ``.json`` beside it."""
    from trtqat.engines.fileformat import MAGIC

    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        return False
    sidecars = (path.with_name(path.name + ".json"), path.with_suffix(".json"))
    return (head.startswith(MAGIC) or head[:4] == b"ftrt"
            or any(s.is_file() and s != path for s in sidecars))


def is_times_file(path: Path) -> bool:
    """An earlier ``--exportTimes`` output: a JSON list."""
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip()[:1] == b"["
    except OSError:
        return False


def is_json_report(path: Path) -> bool:
    """An earlier trtexec-style JSON report (--exportOutput/--exportProfile/--exportLayerInfo):
    a file whose text starts with a JSON list or object."""
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip()[:1] in (b"[", b"{")
    except OSError:
        return False


_JSON_REPORTS = ("exportOutput", "exportProfile", "exportLayerInfo")


def check_engine_outputs(args: argparse.Namespace, outputs: Iterable[tuple[str, str]]) -> None:
    """Refuse engine outputs (``(flag, attribute)``) that are an input of the command or an
    existing file that is not an earlier output of the same kind (an engine; ``--exportTimes``:
    times; ``--exportOutput``/``--exportProfile``/``--exportLayerInfo``: a JSON report)."""
    inputs = [(f"--{name}", getattr(args, name, None))
              for name in ("onnx", "loadEngine", "calibInputs", "timingCacheFile")]
    for flag, attr in outputs:
        value = getattr(args, attr, None)
        if not value:
            continue
        if attr == "exportTimes":
            check_output_file(value, flag, inputs, is_times_file, "an earlier --exportTimes file")
        elif attr in _JSON_REPORTS:
            check_output_file(value, flag, inputs, is_json_report,
                              f"an earlier {flag} file (JSON)")
        else:
            check_output_file(value, flag, inputs, is_engine_file, "an engine file")

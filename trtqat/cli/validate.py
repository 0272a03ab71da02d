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
                      is_ours: Callable[[Path], bool], kind: str, choose: str = "") -> None:
    """Refuse an output ``out`` that is one of the ``(flag, path)`` inputs, or an existing
    file that ``is_ours`` does not recognise as an earlier output of the same kind
    (``choose``: the flag the message asks to change, default ``flag``)."""
    path = Path(out)
    choose = choose or flag
    for in_flag, value in inputs:
        if value and (_same_file(path, Path(str(value)))
                      or path.absolute() == Path(str(value)).absolute()):
            raise OutputPathError(f"{flag} {path} is also the input {in_flag}: writing it "
                                  f"would destroy the input; choose another {choose}")
    if path.exists() and not path.is_file():
        raise OutputPathError(f"{flag} {path} exists and is not a file; choose another "
                              f"{choose}")
    if path.is_file() and not is_ours(path):
        raise OutputPathError(f"{flag} {path} exists and is not {kind}: trtqat does not "
                              "overwrite other files; delete it or choose another "
                              f"{choose}")


def is_sidecar_file(path: Path) -> bool:
    """A trtqat engine sidecar (``<engine>.json`` with trtqat's format marker)."""
    import json

    from trtqat.engines.fileformat import SIDECAR_FORMAT

    try:
        if path.stat().st_size > 16 << 20:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == SIDECAR_FORMAT


def is_engine_file(path: Path) -> bool:
    """An earlier engine artifact: a trtqat engine file, a TensorRT plan ('ftrt' magic), or
    a file with a trtqat sidecar (``<engine>.json``) beside it."""
    from trtqat.engines.fileformat import MAGIC, sidecar_path

    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        return False
    return head.startswith(MAGIC) or head[:4] == b"ftrt" or is_sidecar_file(sidecar_path(path))


# the report each flag writes (trtqat.engines.trtexec_io.report_kind) and its name in messages
REPORTS = {"exportTimes": "times", "exportOutput": "outputs", "exportProfile": "profile",
           "exportLayerInfo": "layers"}
ENGINE_OUTPUTS = ("saveEngine", "out")


def _is_report(kind: str) -> Callable[[Path], bool]:
    def check(path: Path) -> bool:
        from trtqat.engines.trtexec_io import report_kind

        return report_kind(path) == kind

    return check


def _claim(seen: dict[Path, str], flag: str, path: Path) -> None:
    """Refuse two outputs of one command that are the same file."""
    key = path.absolute()
    if key in seen:
        raise OutputPathError(f"{flag} {path} is also {seen[key]}: each output needs its own "
                              "file; choose another path")
    seen[key] = f"{flag}"


def check_engine_outputs(args: argparse.Namespace, outputs: Iterable[tuple[str, str]]) -> None:
    """Refuse engine outputs (``(flag, attribute)``) that are an input of the command, the
    same file as another output, or an existing file that is not an earlier output of the
    same kind, recognised by its content: an engine (with a trtqat sidecar beside it, whose
    own path must be free or a trtqat sidecar too), or the trtexec report the flag writes
    (``--exportTimes``, ``--exportOutput``, ``--exportProfile``, ``--exportLayerInfo``)."""
    from trtqat.engines.fileformat import sidecar_path

    inputs = [(f"--{name}", getattr(args, name, None))
              for name in ("onnx", "loadEngine", "calibInputs", "timingCacheFile")]
    cache = getattr(args, "timingCacheFile", None)
    if cache:  # read and then rewritten by TensorRT: it may be no other input
        check_output_file(cache, "--timingCacheFile", inputs[:3], lambda _: True,
                          "a timing cache")
    seen: dict[Path, str] = {}
    for flag, attr in outputs:
        value = getattr(args, attr, None)
        if not value:
            continue
        path = Path(value)
        _claim(seen, flag, path)
        if attr in REPORTS:
            check_output_file(value, flag, inputs, _is_report(REPORTS[attr]),
                              f"an earlier {flag} file ({REPORTS[attr]} JSON)")
            continue
        check_output_file(value, flag, inputs, is_engine_file, "an engine file")
        side = sidecar_path(path)
        _claim(seen, f"the sidecar of {flag}", side)
        check_output_file(side, f"the sidecar of {flag}", inputs, is_sidecar_file,
                          "a trtqat engine sidecar", choose=flag)

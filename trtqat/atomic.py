"""Atomic file writes: a temporary file beside the target, renamed only once complete.

Temporary files are named ``.NAME.PID-RANDOM.tmp`` (NAME: the target's file name, PID: the
writing process, RANDOM: mkstemp's 8 characters). A write killed half-way leaves one behind;
the next write to the same target removes those whose process is gone
(:func:`remove_stale_temps`), and a run folder removes all of its own when it is opened under
its lock. Only names of exactly that pattern are ever removed: ``.mydata.backup.tmp`` is the
user's. Finished files get the mode a plain
``open()`` would give them (the umask's), not mkstemp's 0600.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from trtqat.errors import TrtqatError

log = logging.getLogger(__name__)

# errors of a full or refused file system (as opposed to a bad path given by the user)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class WriteError(TrtqatError, OSError):
    """A file could not be written (disk full, quota, read-only, ...); the write left nothing
    half-written behind. ``errno`` is the operating system's."""


def write_failed(target: str | os.PathLike[str], exc: OSError, done: str = "nothing was "
                 "written") -> WriteError:
    """The one-line :class:`WriteError` for ``exc``, raised while writing ``target``."""
    if isinstance(exc, WriteError):
        return exc
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = ("free some space or choose another folder" if exc.errno in _NO_SPACE
           else "check the folder and its permissions, or choose another one")
    code = f" (errno {exc.errno})" if exc.errno else ""
    err = WriteError(f"cannot write {target}: {reason}{code}; {done}; {fix}")
    err.errno = exc.errno
    return err

# .NAME.PID-RANDOM.tmp, RANDOM being mkstemp's 8 characters: exactly the names temp_path makes
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)-(?P<rand>[a-z0-9_]{8})\.tmp$")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is exactly the name of a temporary file of :func:`temp_path`."""
    return _TEMP.match(name) is not None


def probe_write(path: str | os.PathLike[str], size: int, done: str = "nothing was written"
                ) -> None:
    """Raise :func:`write_failed`'s line if ``size`` bytes cannot be written at ``path``
    (removed again): tells a full disk from the error a library reports for it."""
    path = Path(path)
    try:
        with open(path, "wb") as f:
            f.write(bytes(min(size, 1 << 26)))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise write_failed(path, exc, done) from None
    finally:
        path.unlink(missing_ok=True)


def default_mode() -> int:
    """The permissions a plain ``open()`` would give a new file (mkstemp makes them 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def is_stale_temp(path: Path, name: str | None = None, *, all_dead: bool = False) -> bool:
    """Whether ``path`` is a temporary file of ours (for target ``name``, if given: its name
    matches :func:`temp_path`'s pattern exactly) whose writer is gone (its PID is not alive).
    ``all_dead``: every writer is known to be gone (a run folder opened under its lock),
    except this process."""
    match = _TEMP.match(path.name)
    if match is None or (name is not None and match["name"] != name):
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return False
    return all_dead or not _pid_alive(pid)


def remove_stale_temps(folder: str | os.PathLike[str], name: str | None = None, *,
                       all_dead: bool = False) -> list[Path]:
    """Remove the stale temporary files of ours in ``folder`` (for target ``name`` only, if
    given); returns what was removed. Files of other programs are never touched."""
    folder = Path(folder)
    pattern = f".{glob_escape(name)}.*.tmp" if name is not None else ".*.tmp"
    removed = []
    try:
        candidates = list(folder.glob(pattern))
    except OSError:
        return removed
    for path in candidates:
        if path.is_file() and is_stale_temp(path, name, all_dead=all_dead):
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
            log.info("removed %s, left by a write that was killed", path)
    return removed


def glob_escape(text: str) -> str:
    """``text`` with glob metacharacters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def temp_path(target: str | os.PathLike[str]) -> Path:
    """A new, empty temporary file beside ``target`` (after removing stale ones of it)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent, target.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}-", suffix=".tmp",
                               dir=target.parent)
    os.close(fd)
    return Path(tmp)


def publish(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Give ``tmp`` the umask's mode and rename it to ``target`` (atomically)."""
    os.chmod(tmp, default_mode())
    os.replace(tmp, target)
    return Path(target)


def fill_atomic(path: str | os.PathLike[str], fill: Callable[[Path], object]) -> Path:
    """Call ``fill(temporary path)`` to create a file beside ``path``, then rename it to
    ``path``. Readers never see half a file; on any error the temporary file is removed
    (an ``OSError`` becomes one :func:`write_failed` line)."""
    target = Path(path)
    try:
        tmp = temp_path(target)
    except OSError as exc:
        raise write_failed(target, exc) from None
    try:
        fill(tmp)
        publish(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_failed(target, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(binary file)`` on a temporary file beside ``path``, then rename it.

    Readers never see half a file; on any error the temporary file is removed.
    """
    def fill(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            write(f)

    return fill_atomic(path, fill)


class NonFiniteJSONError(TrtqatError, ValueError):
    """Data to write as JSON holds NaN or infinity, which JSON cannot express."""


def write_json(path: str | os.PathLike[str], data: Any, **dumps: Any) -> Path:
    """Write ``data`` as indented JSON (one trailing newline) through :func:`write_atomic`;
    ``dumps`` go to ``json.dumps`` (e.g. ``default=str``). NaN and infinity are refused
    (:class:`NonFiniteJSONError`, nothing written): bare ``NaN`` is not JSON."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False, **dumps) + "\n"
    except ValueError as exc:
        if "JSON compliant" not in str(exc):
            raise
        raise NonFiniteJSONError(f"{path} would hold NaN or infinity, which JSON cannot "
                                 "express; nothing written (the values come from a model or "
                                 "input that is not finite)") from None
    return write_atomic(path, lambda f: f.write(text.encode()))


# ------------------------------------------------------------------ outputs that are ours
class ForeignFileError(TrtqatError, ValueError):
    """An output path holds a file that is not an earlier output of the same kind."""


def refuse_foreign(path: str | os.PathLike[str], is_ours: Callable[[Path], bool], kind: str,
                   flag: str) -> None:
    """Raise :class:`ForeignFileError` when ``path`` exists and is not ``kind`` (an earlier
    output that ``is_ours`` recognises by its content): trtqat replaces only its own files."""
    path = Path(path)
    if path.exists() and not (path.is_file() and is_ours(path)):
        raise ForeignFileError(f"{path} exists and is not {kind}: trtqat does not overwrite "
                               f"other files; move it away or choose another {flag}")


def json_with_keys(*keys: str, limit: int = 256 << 20) -> Callable[[Path], bool]:
    """A recogniser of JSON files holding an object with all of ``keys``."""

    def check(path: Path) -> bool:
        try:
            if path.stat().st_size > limit:
                return False
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(k in data for k in keys)

    return check


def starts_with(*magics: bytes) -> Callable[[Path], bool]:
    """A recogniser of files that begin with one of ``magics``."""

    def check(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                head = f.read(max(map(len, magics)))
        except OSError:
            return False
        return any(head.startswith(m) for m in magics)

    return check


PNG = starts_with(b"\x89PNG\r\n\x1a\n")

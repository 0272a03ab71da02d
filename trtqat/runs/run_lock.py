"""One writer per run folder, and ``--overwrite`` that replaces only trtqat's own files.

A :class:`RunGuard` takes an advisory lock (``fcntl.flock`` on ``PARENT/.NAME.lock``, which
holds the writer's PID) before anything is written. A second writer gets one line naming
the holder's PID; the kernel drops the lock of a killed process, so its lock file is simply
taken over. Under the lock every temporary file of ours in the folder is stale and removed.

A folder holding files trtqat cannot prove it wrote (:mod:`trtqat.runs.ownership`) is
refused, ``--overwrite`` included. ``--overwrite`` moves the old run's files (only those)
into ``NAME/.trtqat-replaced`` instead of deleting them. They are deleted once the new run
holds a checkpoint; if the new run fails (or is killed) before that, the new run's files are
removed and the old ones put back, at the latest by the next command that opens the folder.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from trtqat.atomic import remove_stale_temps
from trtqat.runs.ownership import (
    ASIDE,
    MANIFEST,
    entries,
    read_manifest,
    remove_ours,
    remove_tree,
)
from trtqat.runs.run_dir import CHECKPOINTS, RunDirError, check_out_dir

log = logging.getLogger(__name__)


def lock_path(folder: Path) -> Path:
    """The lock file of a run folder (beside it, so that moving the folder keeps it)."""
    folder = folder.absolute()
    return folder.parent / f".{folder.name}.lock"


def aside_path(folder: Path) -> Path:
    """Where ``--overwrite`` keeps the old run's files until the new one has a checkpoint."""
    return Path(folder) / ASIDE


def legacy_aside_path(folder: Path) -> Path:
    """Where ``--overwrite`` of trtqat before the manifest kept the whole old folder."""
    folder = folder.absolute()
    return folder.parent / f".{folder.name}.replaced"


def _holds_checkpoint(folder: Path) -> bool:
    return any((folder / name).is_file() for name in CHECKPOINTS)


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


class RunLock:
    """An exclusive advisory lock on one run folder (``with RunLock(folder): ...``)."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = lock_path(self.folder)
        self._fd: int | None = None
        self._made: list[Path] = []  # parent folders created for the lock file

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`RunDirError` naming the PID that holds it."""
        parent = self.path.parent
        self._made = [p for p in (parent, *parent.parents) if not p.exists()]
        try:
            parent.mkdir(parents=True, exist_ok=True)
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_pid(fd)
                    os.close(fd)
                    raise RunDirError(f"{self.folder} is in use by another trtqat process "
                                      f"(PID {holder}): wait for it to finish, or choose "
                                      "another --out") from None
                try:  # the holder we waited for may have removed the file on release
                    same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            self._remove_made()
            raise RunDirError(f"cannot write the run folder {self.folder}: "
                              f"{exc.strerror or exc}; choose a writable --out") from None
        except BaseException:
            self._remove_made()
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (and its file, and the folders made for it if still empty)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
        self._remove_made()

    def _remove_made(self) -> None:
        for folder in self._made:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        self._made = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _recover(folder: Path) -> None:
    """Finish what a killed ``--overwrite`` left (called under the lock)."""
    _recover_legacy(folder)
    old = aside_path(folder)
    if not old.is_dir() or old.is_symlink():
        return
    if _holds_checkpoint(folder):
        remove_tree(old)
        log.info("removed the old run in %s: the run that replaced it has a checkpoint", old)
        return
    for name in read_manifest(folder):  # the new run's files: it wrote only these
        remove_ours(folder, name)
    (folder / MANIFEST).unlink(missing_ok=True)
    kept = []
    for entry in sorted(old.iterdir()):
        dest = folder / entry.name
        if dest.exists() or dest.is_symlink():
            kept.append(entry.name)
            continue
        os.replace(entry, dest)
    if kept:
        log.warning("%s still holds %s of the old run (the folder has files of that name "
                    "now): move back what you need", old, ", ".join(kept))
    else:
        old.rmdir()
    log.warning("restored %s: the --overwrite run that replaced it stopped before its first "
                "checkpoint", folder)


def _recover_legacy(folder: Path) -> None:
    """An older trtqat's killed ``--overwrite`` moved the whole folder aside: put it back
    only where nothing is in the way (deleting it could lose the user's files in it)."""
    old = legacy_aside_path(folder)
    if not old.is_dir():
        return
    try:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        if not folder.exists():
            os.replace(old, folder)
            log.warning("restored %s from %s (an interrupted --overwrite)", folder, old)
            return
    except OSError:
        pass
    log.warning("%s holds the run an interrupted --overwrite of an older trtqat moved aside "
                "(with any other files that were in %s): move back what you need and delete "
                "it", old, folder)


def _move_aside(folder: Path) -> Path:
    """Move the old run's files (trtqat's only: checked before) into :func:`aside_path`."""
    old = aside_path(folder)
    try:
        old.mkdir()
    except FileExistsError:
        raise RunDirError(f"{old} still holds files of an earlier run that could not be put "
                          "back: move back what you need and delete it, then run again"
                          ) from None
    for name in entries(folder)[0]:
        os.replace(folder / name, old / name)
    if (folder / MANIFEST).is_file():
        os.replace(folder / MANIFEST, old / MANIFEST)
    return old


def _check_inputs_outside(folder: Path, inputs: Iterable[tuple[str, object]]) -> None:
    """``--overwrite`` moves the old run away: refuse when an input of the command is in it."""
    root = folder.absolute().resolve()
    for flag, value in inputs:
        if value and root in (Path(str(value)).absolute().resolve(),
                              *Path(str(value)).absolute().resolve().parents):
            raise RunDirError(f"{flag} {value} is inside --out {folder}, which --overwrite "
                              "replaces: the run would destroy its own input; choose another "
                              "--out")


class RunGuard:
    """The run folder of one command, locked, with ``--overwrite`` made safe; see module doc.

    Only the writing process (``enabled``, rank 0) locks and moves folders; on other ranks
    this only checks the options. Call :meth:`close` when the command ends (any way).
    """

    def __init__(self, out: str | os.PathLike, resume: bool, overwrite: bool,
                 enabled: bool = True, inputs: Iterable[tuple[str, object]] = ()) -> None:
        self.path = Path(out)
        inputs = list(inputs) if overwrite else []  # checked after the folder's own files
        self._lock: RunLock | None = None
        self._aside: Path | None = None
        if not enabled:
            check_out_dir(self.path, resume, overwrite)
            _check_inputs_outside(self.path, inputs)
            return
        if self.path.exists() and not self.path.is_dir():
            check_out_dir(self.path, resume, overwrite)  # one clear line
        self._lock = RunLock(self.path).acquire()
        try:
            _recover(self.path)
            check_out_dir(self.path, resume, overwrite)  # the user's files: one line
            _check_inputs_outside(self.path, inputs)  # an input among trtqat's files
            if self.path.is_dir():
                remove_stale_temps(self.path, all_dead=True)
            if overwrite and _holds_checkpoint(self.path):
                self._aside = _move_aside(self.path)
                log.info("the old run is kept in %s until the new one has a checkpoint",
                         self._aside)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RunGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete or restore the old run (see module doc) and release the lock."""
        try:
            if self._aside is not None:
                _recover(self.path)
                self._aside = None
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None


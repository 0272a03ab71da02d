"""The run folder: ``args.yaml``, ``metrics.jsonl``, checkpoints and TensorBoard scalars.

Only the main process (rank 0) writes; on other ranks every method is a no-op. Every name
written is listed in the folder's manifest first (:mod:`trtqat.runs.ownership`): trtqat
replaces or deletes only those, and a folder holding anything else is refused.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import yaml

from trtqat.atomic import remove_stale_temps, write_atomic, write_failed
from trtqat.errors import TrtqatError
from trtqat.runs.ownership import (
    ARGS,
    CHECKPOINTS,
    METRICS,
    TB,
    claim,
    entries,
    read_manifest,
    remove_ours,
    write_manifest,
)

log = logging.getLogger(__name__)


def _json_safe(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with NaN and infinity as null (they are not JSON)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in record.items()}


class RunDirError(TrtqatError, RuntimeError):
    """The run folder cannot be used as asked (already holds a run, nothing to resume)."""


def _atomic_write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode()))


def refuse_foreign(path: Path, flag: str = "--out") -> None:
    """Refuse a run folder that holds files trtqat cannot prove it wrote (named, first few)."""
    foreign = entries(path)[1] if path.is_dir() else []
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3
                                          else "")
        raise RunDirError(f"{flag} {path} holds files that are not trtqat's ({shown}): trtqat "
                          "writes runs only into new or empty folders or its own run folders, "
                          "and never replaces other files (--overwrite included); move them "
                          f"away or choose another {flag}")


def check_out_dir(out: str | os.PathLike, resume: bool, overwrite: bool) -> Path:
    """Refuse a folder holding files that are not trtqat's, to clobber an existing run
    (unless ``overwrite``) or to resume a missing one."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--out {path} is a file, not a folder: choose another --out")
    refuse_foreign(path)
    has_run = any((path / n).exists() for n in CHECKPOINTS)
    if resume:
        if not (path / "last.pt").is_file():
            raise RunDirError(f"--resume: {path}/last.pt does not exist; nothing to resume "
                              "(drop --resume to start a new run)")
    elif has_run and not overwrite:
        raise RunDirError(f"{path} already holds a run: pass --resume to continue it, "
                          "--overwrite to replace it, or choose another --out")
    return path


class RunDir:
    """Writes the artifacts of one run into ``path`` (rank 0 only)."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True,
                 tensorboard: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        self._tb = None
        self._want_tb = tensorboard
        self._wrote: list[str] = []  # names this run wrote (discard removes only these)
        self._tb_before: set[str] = set()
        self._made_folder = False

    def file(self, name: str) -> Path:
        """The path of ``name`` inside the run folder."""
        return self.path / name

    def start(self, args: dict[str, Any], resume: bool) -> None:
        """Create the folder and write ``args.yaml``; a fresh run starts an empty metrics file."""
        if not self.enabled:
            return
        self._made_folder = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        names = [ARGS, METRICS, *CHECKPOINTS, *([TB] if self._want_tb else [])]
        claim(self.path, names)  # listed before written: a kill leaves nothing unowned
        self._wrote = [] if resume else names
        if self._want_tb and (self.path / TB).is_dir():
            self._tb_before = {str(p) for p in (self.path / TB).rglob("*")}
        _atomic_write_text(self.file(ARGS), yaml.safe_dump(args, sort_keys=False))
        if not resume:
            _atomic_write_text(self.file(METRICS), "")
            for name in CHECKPOINTS:
                self.file(name).unlink(missing_ok=True)
        if self._want_tb:
            self._tb = _summary_writer(self.path / TB)

    def truncate_metrics(self, stage: str, epoch: int, record: dict | None = None) -> None:
        """Drop metric lines of ``stage`` written after ``epoch`` (a run killed mid-save;
        those epochs run again and log their records anew). A torn last line (a killed
        write) is dropped with a WARNING; ``record`` (the resumed checkpoint's metrics of
        ``epoch``) is written back when its line is missing. Any other damage (binary
        data, a line that is not a record) is a :class:`RunDirError` naming the file."""
        if not self.enabled or not self.file(METRICS).is_file():
            return
        kept = []
        path = self.file(METRICS)
        fix = (f"restore {path.name} from a backup, or move it away to resume without its "
               "history")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            text = "\0"
        if "\0" in text:
            raise RunDirError(f"--resume: {path} holds binary data, not JSON lines of metrics "
                              f"(overwritten or damaged); {fix}")
        lines = text.splitlines()
        last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if number == last and line.lstrip().startswith("{"):
                    log.warning("--resume: dropped the last line of %s, cut short by a "
                                "killed write (%r...); its epoch runs again", path, line[:40])
                    continue
                raise RunDirError(f"--resume: {path} line {number} is not JSON "
                                  f"({line.strip()[:40]!r}): the file is damaged; {fix}"
                                  ) from None
            try:
                later = rec.get("stage") == stage and int(rec.get("epoch", 0)) > epoch
            except (AttributeError, TypeError, ValueError):
                raise RunDirError(f"--resume: {path} line {number} is not a metrics record "
                                  "(a JSON object with an integer 'epoch'): "
                                  f"{line.strip()[:60]!r}; remove that line (or the file) "
                                  "to resume") from None
            if not later:
                kept.append(line)
            if rec.get("stage") == stage and rec.get("epoch") == epoch:
                record = None  # the resumed epoch's line is there
        if isinstance(record, dict) and record.get("stage") == stage and epoch > 0:
            log.warning("--resume: %s lacked the record of %s epoch %d; rewritten from the "
                        "checkpoint", path, stage, epoch)
            kept.append(json.dumps(_json_safe(record)))
        _atomic_write_text(self.file(METRICS), "".join(k + "\n" for k in kept))

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one JSON line to ``metrics.jsonl`` (and scalars to TensorBoard)."""
        if not self.enabled:
            return
        try:
            line = json.dumps(_json_safe(record))
            with open(self.file(METRICS), "a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise write_failed(self.file(METRICS), exc, "the metrics line was not logged") from None
        if self._tb is not None:
            step = int(record.get("epoch", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "epoch":
                    self._tb.add_scalar(f"{record.get('stage', 'run')}/{key}", value, step)
            self._tb.flush()

    def discard(self) -> None:
        """Remove what :meth:`start` and the stage wrote (args, metrics, checkpoints, the
        TensorBoard files this run made), and the folder if that leaves it empty: a stage
        that fails to write its checkpoint leaves no run behind. Nothing else is touched (a
        folder that existed before stays)."""
        if not self.enabled:
            return
        self.close()
        for name in self._wrote:
            if name == TB:
                self._discard_tb()
            else:
                self.file(name).unlink(missing_ok=True)
        remove_stale_temps(self.path, all_dead=True)
        left = {n for n in read_manifest(self.path) if (self.path / n).exists()}
        try:
            write_manifest(self.path, left)
            if self._made_folder:
                self.path.rmdir()
        except OSError:
            pass  # other files: the folder stays

    def _discard_tb(self) -> None:
        tb = self.path / TB
        if not tb.is_dir():
            return
        if self._tb_before:  # an earlier run's events stay
            for path in sorted(tb.rglob("*"), reverse=True):
                if str(path) not in self._tb_before and path.is_file():
                    path.unlink(missing_ok=True)
            return
        remove_ours(self.path, TB)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _summary_writer(logdir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        log.debug("tensorboard is not installed: no TensorBoard scalars (pip install tensorboard)")
        return None
    return SummaryWriter(log_dir=str(logdir))


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` file (or of the one inside a run folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

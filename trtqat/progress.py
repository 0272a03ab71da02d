"""One progress mechanism for every long loop: a tqdm bar on a terminal, plain lines off one.

Off a terminal (a log file, ``make demo > log``, a CI job) a bar would write a ``\\r`` update
per step, or nothing at all; :class:`PlainProgress` writes a line when the loop starts, at
most one every ``every_s`` seconds (30) while it runs, and one when it ends::

    qat 1/2: 0/400 batches
    qat 1/2: 120/400 batches, 12.3 it/s, eta 23s, loss 0.1234
    qat 1/2: 400/400 batches in 32.5s, 12.3 it/s

so a loop is never silent for longer than that. ``brief`` loops (checks that are usually
quick) skip the start and end lines unless they ran longer than ``every_s``.
``progress=False`` (``--no-progress``) silences both.

    bar = progress(loader, total=len(loader), desc="train 1/15")
    for x, y in bar:
        ...
        bar.set_postfix(loss=f"{loss:.4f}")

This module imports nothing of trtqat (tqdm only when a bar is drawn), so every layer may
use it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

EVERY_S = 30.0  # seconds between two plain lines


def is_terminal(stream: IO[str] | None) -> bool:
    """Whether ``stream`` is a terminal (False for a replaced or closed one)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


def _seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    m, s = divmod(int(round(s)), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


class PlainProgress:
    """A progress report in plain lines (see the module doc), with tqdm's interface:
    iterate it, or call :meth:`update`; :meth:`set_postfix`; :meth:`close`."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None,
                 desc: str = "", *, unit: str = "batches", stream: IO[str] | None = None,
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic,
                 enabled: bool = True, brief: bool = False) -> None:
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.stream, self.every_s, self.clock, self.enabled = stream, every_s, clock, enabled
        self.n, self.postfix, self.closed, self.brief = 0, "", False, brief
        self.start = self.last = clock()
        if not brief:
            self._line(f"{self._count()}")

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:  # also when the loop breaks early
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self) -> str:
        return f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"

    def _line(self, text: str) -> None:
        if self.enabled:
            stream = self.stream or sys.stderr
            print(f"{self.desc}: {text}" if self.desc else text, file=stream, flush=True)

    def _rate(self, now: float) -> float:
        return self.n / (now - self.start) if now > self.start else 0.0

    def update(self, n: int = 1) -> None:
        """``n`` more steps done; a line if ``every_s`` passed since the last one."""
        self.n += n
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        rate = self._rate(now)
        parts = [self._count(), f"{rate:.1f} it/s"]
        if self.total and rate > 0:
            parts.append(f"eta {_seconds((self.total - self.n) / rate)}")
        self._line(", ".join(parts + ([self.postfix] if self.postfix else [])))

    def set_postfix(self, **values: Any) -> None:
        """Values shown at the end of the next line, e.g. ``loss=0.1234``."""
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        """The closing line (once)."""
        if self.closed:
            return
        self.closed = True
        now = self.clock()
        if self.brief and now - self.start < self.every_s:
            return
        self._line(f"{self._count()} in {_seconds(now - self.start)}, "
                   f"{self._rate(now):.1f} it/s" + (f", {self.postfix}" if self.postfix else ""))


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
             enabled: bool = True, unit: str = "batches", stream: IO[str] | None = None,
             every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic,
             brief: bool = False) -> Any:
    """A tqdm bar over ``iterable`` when ``stream`` (stderr) is a terminal, else a
    :class:`PlainProgress` (``brief``: no start and end lines for a loop shorter than
    ``every_s``); both silent unless ``enabled``. Either has ``update``, ``set_postfix``
    and ``close``."""
    stream = stream or sys.stderr
    if enabled and is_terminal(stream):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True,
                    file=stream)
    return PlainProgress(iterable, total, desc, unit=unit, stream=stream, every_s=every_s,
                         clock=clock, enabled=enabled, brief=brief)


def write(message: str, stream: IO[str] | None = None) -> None:
    """A line between progress output (above a terminal's bar; plain otherwise)."""
    stream = stream or sys.stderr
    if is_terminal(stream):
        from tqdm.auto import tqdm

        tqdm.write(message, file=stream)
    else:
        print(message, file=stream, flush=True)

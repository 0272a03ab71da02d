"""CPU threads of a run (``--threads N``): set once, before any torch work, for PyTorch and
for the ONNX Runtime sessions trtqat opens.

Without ``--threads`` PyTorch and ONNX Runtime keep their own defaults: ``OMP_NUM_THREADS``
when set, else one thread per core. That is the fastest on a machine of one's own; on a
shared or busy one, threads wait for each other (``trtqat train`` ran at 3 img/s with two
threads on a busy 2-core machine and at 73-86 img/s with one), so ``--threads 1`` there.

This module imports no torch at import time (engines use :func:`cpu_threads` and import no
torch at all); :func:`apply_threads` imports it only when asked to set it.
"""

from __future__ import annotations

from trtqat.errors import TrtqatError

DEFAULT_HELP = ("CPU threads of PyTorch (intra- and inter-op) and of ONNX Runtime's sessions "
                "(default: theirs, OMP_NUM_THREADS or one per core; on a shared or busy "
                "machine --threads 1 can be many times faster)")

_STATE: dict[str, int | None] = {"threads": None}


class ThreadsError(TrtqatError, ValueError):
    """A thread count that is not a whole number >= 1."""


def check_threads(threads: object) -> int | None:
    """``threads`` as an int >= 1, or None (the libraries' defaults); else :class:`ThreadsError`."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ThreadsError(f"threads must be a whole number >= 1, got {threads!r}; leave it out "
                           "for the default (one per core)")
    return threads


def apply_threads(threads: int | None, *, torch: bool = True) -> int | None:
    """Use ``threads`` CPU threads from now on (None: leave the defaults): ONNX Runtime
    sessions opened by trtqat read :func:`cpu_threads`; ``torch``: also
    ``torch.set_num_threads`` and, while PyTorch still allows it (before its first
    inter-op parallel work), ``torch.set_num_interop_threads``. Returns ``threads``."""
    threads = check_threads(threads)
    if threads is None:
        return None
    _STATE["threads"] = threads
    if torch:
        import torch as _torch

        _torch.set_num_threads(threads)
        if _torch.get_num_interop_threads() != threads:
            try:
                _torch.set_num_interop_threads(threads)
            except RuntimeError:  # inter-op work already ran: its pool is fixed for good
                pass
    return threads


def cpu_threads() -> int | None:
    """The thread count :func:`apply_threads` set (None: the libraries' defaults)."""
    return _STATE["threads"]


def reset_threads() -> None:
    """Forget :func:`apply_threads`' count (tests; torch keeps what it was set to)."""
    _STATE["threads"] = None

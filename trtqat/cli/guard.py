"""How every trtqat command ends: a user error is one ``PROG: error: ...`` line (exit 1),
Ctrl-C one ``PROG: interrupted`` line (exit 130).

A full or refused file system (ENOSPC, EDQUOT, EFBIG, EROFS, EIO) is the machine's state,
not a bug: wherever it surfaces it is one line too (trtqat's own writers say which file; they
leave nothing half-written).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

from trtqat.errors import TrtqatError

_FILE_SYSTEM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


def run_guarded(prog: str, command: Callable[[], int | None]) -> int:
    """Run ``command()`` and return its exit status (0 for None)."""
    try:
        return int(command() or 0)
    except TrtqatError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in _FILE_SYSTEM:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"{prog}: error: cannot write{where}: {exc.strerror or exc} (errno "
              f"{exc.errno}); free some space "
              "or choose another folder", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130

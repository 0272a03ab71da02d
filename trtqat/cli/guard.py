"""How every trtqat command ends: a user error is one ``PROG: error: ...`` line (exit 1),
Ctrl-C one ``PROG: interrupted`` line (exit 130)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from trtqat.errors import TrtqatError


def run_guarded(prog: str, command: Callable[[], int | None]) -> int:
    """Run ``command()`` and return its exit status (0 for None)."""
    try:
        return int(command() or 0)
    except TrtqatError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130

"""Image sizes as the command line spells them (``224``, ``224x160``): torch-free, so the
parser and every layer may use them."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from trtqat.errors import TrtqatError


class DataSourceError(TrtqatError, ValueError):
    """Unusable data or preprocessing options (empty folder, wrong shape, bad value)."""


def parse_size(text: str | int | Sequence[int], flag: str = "--image-size"
               ) -> int | tuple[int, int]:
    """``"224"`` -> 224, ``"224x160"`` -> (224, 160) (height x width); lists are accepted."""
    if isinstance(text, int):
        nums = [text]
    elif isinstance(text, (list, tuple)):
        nums = [int(t) for t in text]
    else:
        try:
            nums = [int(p) for p in str(text).lower().replace("*", "x").split("x")]
        except ValueError:
            nums = []
    if len(nums) not in (1, 2):
        raise DataSourceError(f"{flag} {text!r}: use N (square) or HxW, e.g. 224x160")
    if min(nums) < 1:
        raise DataSourceError(f"{flag} must be >= 1, got {text!r}")
    return nums[0] if len(nums) == 1 or nums[0] == nums[1] else (nums[0], nums[1])


def hw(size: int | Sequence[int]) -> tuple[int, int]:
    """``(height, width)`` of an image size (an int means square)."""
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def size_text(size: int | Sequence[int]) -> str:
    """``"32x32"`` / ``"224x160"`` for messages and file names."""
    h, w = hw(size)
    return f"{h}x{w}"


def total_memory() -> int:
    """Bytes of physical memory of this machine (a large number if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 60


def format_bytes(n: float) -> str:
    """``71.9 TB``: decimal units, three digits."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def check_image_memory(size: int | Sequence[int], channels: int = 3, count: int = 1,
                       what: str = "one image", flag: str = "--image-size") -> None:
    """Refuse (:class:`DataSourceError`, before anything is allocated) an image size whose
    ``count`` float32 images would not fit in this machine's memory, saying what it needs."""
    h, w = hw(size)
    need = 4 * math.prod((count, channels, h, w))
    if need > total_memory():
        raise DataSourceError(f"{flag} {size_text(size)} needs {format_bytes(need)} for {what} "
                              f"({count} x {channels} x {h} x {w} x 4 bytes), more than this "
                              f"machine's {format_bytes(total_memory())} of memory: use a "
                              f"smaller {flag}")

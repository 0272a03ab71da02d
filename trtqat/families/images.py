"""Opening image files for every family's data readers.

Importing ``ultralytics`` replaces ``PIL.Image.open`` for the whole process with a wrapper
that answers a file PIL cannot identify by trying to install a HEIF plugin (a pip call, or
warnings when offline) and retrying. A data reader must answer such a file with its own
one line, so trtqat opens images with PIL's own function whatever was imported before.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def open_image(path: str | os.PathLike[str]) -> Any:
    """``PIL.Image.open(path)``, never through Ultralytics' patch of it."""
    from PIL import Image

    opener = Image.open
    patches = sys.modules.get("ultralytics.utils.patches")
    if patches is not None and opener is getattr(patches, "image_open", None):
        opener = getattr(patches, "_image_open", opener)  # PIL's, as the patch saved it
    return opener(path)

"""What ``compare`` measures every variant on, whatever the family: :class:`EvalData`.

A family builds it (``family.compare_data``); the image classifiers' is :func:`image_data`
(labelled validation images, top-1/top-5), the encoders' is
:func:`trtqat.families.encoder.compare_data.sentence_data` (held-out sentences, embedding fidelity).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trtqat.families.types import CompareError, EvalData, Feed

__all__ = ["EvalData", "Feed", "feed_for"]


def feed_for(feed: Feed, names: list[str], source: Path | str) -> dict[str, np.ndarray]:
    """``feed`` as ``{input name: array}`` for a file with inputs ``names``."""
    if not isinstance(feed, dict):
        if len(names) != 1:
            raise CompareError(f"{source} has {len(names)} inputs; this data feeds one")
        return {names[0]: feed}
    missing = [n for n in names if n not in feed]
    if missing:
        raise CompareError(f"{source} wants input '{missing[0]}', which the data does not "
                           "make: is it an export of this model?")
    return {n: feed[n] for n in names}

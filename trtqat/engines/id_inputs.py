"""Valid values for the integer inputs of encoders (token ids, attention masks, segment ids)
in random feeds: the timing feeds of :mod:`trtqat.engines.feeds` and the synthetic check
inputs of :mod:`trtqat.engines.ort_check`. numpy only."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Fallback range of token-id inputs whose embedding table cannot be found (the tokenizers
# of the BERT family have far more than 1000 ids).
SAFE_TOKEN_RANGE = 1000


def valid_integer_feed(feed: Mapping[str, np.ndarray], bounds: Mapping[str, int],
                       seed: int = 0) -> dict[str, np.ndarray]:
    """Make random integer inputs valid for encoders: ``*mask*`` inputs all ones,
    ``token_type``/``segment`` inputs zeros, other integer inputs (token ids) uniform in
    ``[0, bound)`` (the embedding table's rows, else ``[0, 1000)``). Float and bool inputs
    are kept."""
    rng = np.random.default_rng(seed)
    out = dict(feed)
    for name, array in feed.items():
        if array.dtype.kind not in "iu":
            continue
        low = name.lower()
        if "mask" in low:
            out[name] = np.ones_like(array)
        elif "token_type" in low or "segment" in low:
            out[name] = np.zeros_like(array)
        else:
            high = bounds.get(name, SAFE_TOKEN_RANGE)
            out[name] = rng.integers(0, max(1, high), size=array.shape).astype(array.dtype)
    return out

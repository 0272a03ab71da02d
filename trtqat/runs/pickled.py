"""One wording for files that ``torch.load(..., weights_only=True)`` refuses.

torch's own message for such a file advises re-running with weights_only off: that
would run whatever code the file carries. trtqat never relays it; :func:`reason` says what
the file is and the safe fix instead.
"""

from __future__ import annotations

STATE_DICT_FIX = "save a plain state_dict (torch.save(model.state_dict(), PATH))"
_OBJECTS = ("unsupported global", "allow_pickle")  # a class or function named in the pickle
_REFUSED = ("weights only load failed", "weights_only")  # torch's text, whatever the cause


def is_pickled_objects(exc: BaseException) -> bool:
    """True when ``exc`` is torch (or numpy) refusing pickled Python objects."""
    text = str(exc).lower()
    return any(h in text for h in _OBJECTS)


def reason(exc: BaseException, fix: str = STATE_DICT_FIX) -> str:
    """Why a file could not be loaded, in one line, never with torch's unsafe advice.

    ``fix``: what to save instead when the file holds pickled Python objects.
    """
    if is_pickled_objects(exc):
        return ("it holds pickled Python objects, which trtqat does not load (loading them "
                f"would run code the file carries): {fix}")
    text = str(exc)
    if any(h in text.lower() for h in _REFUSED):
        return "it is not a file of tensors (corrupt, truncated, or another format)"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:200]

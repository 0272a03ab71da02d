"""``utils.quant_logging``: :func:`reset_logger_handler`."""

from __future__ import annotations

import logging


def reset_logger_handler() -> None:
    """Remove every handler of the root logger (so an application can install its own)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)

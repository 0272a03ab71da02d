"""User errors of the export stage (one line each at the command line)."""

from __future__ import annotations

from typing import Any

from trtqat.errors import TrtqatError


class ExportError(TrtqatError, RuntimeError):
    """The model cannot be exported as asked (state, op, output folder, ...)."""


class ValidationError(ExportError):
    """An exported file failed its checks; no file was kept.

    ``result`` holds the :class:`~trtqat.export.onnx_export.ExportResult` with every check,
    so a caller can print the per-output lines before the one-line error.
    """

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class LintError(ExportError):
    """The ONNX file given to the lint cannot be read."""

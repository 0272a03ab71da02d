"""User-error exceptions.

Every mistake a user can make (bad input, missing calibration, wrong file) raises a
subclass of :class:`TrtqatError`; the command line catches this family and prints one line.
Bugs raise ordinary exceptions and keep their traceback.
"""

from __future__ import annotations


class TrtqatError(Exception):
    """Base class of user errors: the message names the problem and the fix."""


class QuantConfigError(TrtqatError, ValueError):
    """An invalid quantization setting (bits, axis, calibration method, ...)."""


class QuantInputError(TrtqatError, TypeError):
    """A tensor handed to a fake-quant op that it cannot quantize (e.g. integer dtype)."""


class QuantizerStateError(TrtqatError, RuntimeError):
    """A quantizer is not usable as it is (amax missing, NaN, zero, wrong shape)."""


class CalibrationError(TrtqatError, RuntimeError):
    """Calibration could not produce a range (no data, unknown method, ...)."""

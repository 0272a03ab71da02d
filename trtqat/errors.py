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


class QuantConfigTypeError(QuantConfigError, TypeError):
    """A quantization setting of the wrong type (a string where a bool or number goes)."""


class QuantInputError(TrtqatError, TypeError):
    """A tensor handed to a fake-quant op that it cannot quantize (e.g. integer dtype)."""


class QuantizerStateError(TrtqatError, RuntimeError):
    """A quantizer is not usable as it is (amax missing, NaN, zero, wrong shape)."""


class CalibrationError(TrtqatError, RuntimeError):
    """Calibration could not produce a range (no data, unknown method, ...)."""


class QuantTypeError(TrtqatError, TypeError):
    """A quantization argument of the wrong type or an unknown keyword (pytorch-quantization
    raises TypeError for these)."""


class AmaxValueError(QuantizerStateError, ValueError):
    """An amax that cannot be a range: negative, NaN, infinite, empty or all zero."""


class CalibrationMethodError(CalibrationError, TypeError):
    """An unknown calibration method (pytorch-quantization raises TypeError)."""


class CalibrationValueError(CalibrationError, ValueError):
    """A calibration argument out of range, e.g. a percentile outside (0, 100]."""

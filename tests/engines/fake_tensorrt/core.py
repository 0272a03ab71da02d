"""The fake TensorRT: see the package docstring."""

from __future__ import annotations

import enum
import types
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx

API_FILES = {10: Path(__file__).parent / "api" / "tensorrt-10-python-api.txt",
             11: Path(__file__).parent / "api" / "tensorrt-11-python-api.txt"}
_PLAN_MAGIC = b"FAKEPLAN"
_CACHE_MAGIC = b"FAKETC"


@cache
def api_names(major: int) -> frozenset[str]:
    """``Class.member`` and bare names of TensorRT ``major``'s Python API."""
    lines = API_FILES[major].read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _enum(major: int, name: str, without: frozenset[str] = frozenset()
          ) -> type[enum.IntEnum]:
    members = sorted(n.split(".", 1)[1] for n in api_names(major) - without
                     if n.startswith(name + ".") and not n.split(".", 1)[1].startswith("_")
                     and n.split(".", 1)[1].isupper())
    return enum.IntEnum(name, [(m, i) for i, m in enumerate(members)])


class Dims(tuple):
    """TensorRT's Dims: a tuple of ints, -1 for a dynamic dimension."""


def _dims(values: Any, what: str) -> Dims:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what}: expected a sequence of ints, got {type(values).__name__}")
    out = tuple(values)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in out):
        raise TypeError(f"{what}: dims must be ints, got {out!r}")
    return Dims(int(d) for d in out)


def _np_of(onnx_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


def make_module(version: str = "11.4.0.106", without: tuple[str, ...] = ()) -> types.ModuleType:
    """A fresh fake ``tensorrt`` module of the given version (10.x or 11.x; an older version
    gets 10's API less the ``Class.MEMBER`` names in ``without``, e.g. an 8.6-like
    ``make_module("8.6.1", without=("BuilderFlag.FP8", "BuilderFlag.INT4"))``)."""
    major = int(version.split(".")[0])
    api_major, drop = max(10, min(major, 11)), frozenset(without)
    mod = types.ModuleType("tensorrt")
    mod.__version__ = version
    calls: list[tuple[str, tuple]] = []
    fail: dict[str, Any] = {}
    mod._calls, mod._fail, mod._major = calls, fail, major

    def record(name: str, *args: Any) -> None:
        calls.append((name, args))

    Severity = _enum(api_major, "Severity", drop)
    DataType = _enum(api_major, "DataType", drop)
    TensorIOMode = _enum(api_major, "TensorIOMode", drop)
    MemoryPoolType = _enum(api_major, "MemoryPoolType", drop)
    BuilderFlag = _enum(api_major, "BuilderFlag", drop)
    NetworkDefinitionCreationFlag = _enum(api_major, "NetworkDefinitionCreationFlag", drop)
    ProfilingVerbosity = _enum(api_major, "ProfilingVerbosity", drop)
    LayerInformationFormat = _enum(api_major, "LayerInformationFormat", drop)
    to_trt = {np.dtype(np.float32): DataType.FLOAT, np.dtype(np.float16): DataType.HALF,
              np.dtype(np.int8): DataType.INT8, np.dtype(np.int32): DataType.INT32,
              np.dtype(np.int64): DataType.INT64, np.dtype(np.bool_): DataType.BOOL,
              np.dtype(np.uint8): DataType.UINT8}

    class ILogger:
        pass

    for member in Severity:  # pybind11 export_values(): ILogger.WARNING == Severity.WARNING
        setattr(ILogger, member.name, member)
    ILogger.Severity = Severity

    class Logger(ILogger):
        def __init__(self, min_severity: Any = Severity.WARNING) -> None:
            if not isinstance(min_severity, Severity):
                raise TypeError(f"Logger(min_severity): expected Severity, got {min_severity!r}")
            self._min = min_severity
            self._messages: list[tuple[Any, str]] = []

        @property
        def min_severity(self) -> Any:
            return self._min

        def log(self, severity: Any, msg: str) -> None:
            self._messages.append((severity, msg))

    def _check_logger(logger: Any, where: str) -> None:
        if not isinstance(logger, ILogger):
            raise TypeError(f"{where}: expected an ILogger, got {type(logger).__name__}")

    # the classes live in fake_builder / fake_runtime, closing over this flavour's namespace
    ctx = SimpleNamespace(**{k: v for k, v in locals().items() if k != "ctx"})
    ctx.__dict__.update(fake_builder.define(ctx))
    inverse = {v: k for k, v in to_trt.items()}
    ctx._np_dtype = lambda dtype: inverse[dtype]
    ctx.__dict__.update(fake_runtime.define(ctx))
    for name, value in vars(ctx).items():
        if isinstance(value, type) and name[0].isupper() and name != "Dims":
            setattr(mod, name, value)
    mod.Dims = Dims
    return mod


from . import fake_builder, fake_runtime  # noqa: E402 - they import the helpers above

"""The ``tensorrt`` module, imported on first use, and the small helpers the TensorRT backend
(``trt``) and its runner (``trt_runner``) share."""

from __future__ import annotations

from typing import Any

import numpy as np

from trtqat.engines.errors import INSTALL_HINT, BackendUnavailableError, EngineBuildError


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, or a one-line install hint."""
    try:
        import tensorrt
    except ImportError:
        raise BackendUnavailableError(f"TensorRT is not installed; {INSTALL_HINT} (needs an "
                                      "NVIDIA GPU), or use --backend=ort") from None
    return tensorrt


def trt_major(trt: Any) -> int:
    """Major version of the running TensorRT (10, 11, ...)."""
    return int(str(trt.__version__).split(".")[0])


def numpy_dtype(trt: Any, dtype: Any) -> np.dtype:
    """numpy dtype of a ``tensorrt.DataType``."""
    table = {trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16,
             trt.DataType.INT8: np.int8, trt.DataType.INT32: np.int32,
             trt.DataType.INT64: np.int64, trt.DataType.BOOL: np.bool_,
             trt.DataType.UINT8: np.uint8}
    if dtype not in table:
        raise EngineBuildError(f"engine tensor type {dtype} has no numpy equivalent; export the "
                               "model's inputs/outputs as float32, float16 or an integer type")
    return np.dtype(table[dtype])

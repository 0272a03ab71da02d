"""A minimal fake ``pycuda.driver`` (the names trtqat's pycuda fallback uses)."""

from __future__ import annotations

import ctypes
import time
import types

import numpy as np


def make_driver(devices: int = 1) -> types.ModuleType:
    """A fresh fake ``pycuda.driver`` module; ``driver._log`` records calls."""
    drv = types.ModuleType("pycuda.driver")
    log: list[str] = []
    drv._log = log

    class DeviceAllocation:
        def __init__(self, size: int) -> None:
            self._buf = ctypes.create_string_buffer(size)

        def __int__(self) -> int:
            return ctypes.addressof(self._buf)

        def free(self) -> None:
            log.append("free")
            self._buf = None

    class Context:
        def push(self) -> None:
            log.append("push")

        def pop(self) -> None:
            log.append("pop")

    class Device:
        def __init__(self, ordinal: int) -> None:
            self.ordinal = ordinal

        @staticmethod
        def count() -> int:
            return devices

        def retain_primary_context(self) -> Context:
            return Context()

    class Stream:
        handle = 7

        def synchronize(self) -> None:
            log.append("sync")

    class Event:
        def record(self, stream: Stream | None = None) -> None:
            self._t = time.perf_counter() * 1000.0

        def synchronize(self) -> None:
            pass

        def query(self) -> bool:
            return True

        def time_since(self, start: Event) -> float:
            return self._t - start._t

    def memcpy_htod_async(dest: int, src: np.ndarray, stream: Stream | None = None) -> None:
        ctypes.memmove(int(dest), src.ctypes.data, src.nbytes)

    def memcpy_dtoh_async(dest: np.ndarray, src: int, stream: Stream | None = None) -> None:
        ctypes.memmove(dest.ctypes.data, int(src), dest.nbytes)

    drv.init = lambda flags=0: log.append("init")
    drv.Device, drv.Stream, drv.Event = Device, Stream, Event
    drv.mem_alloc = DeviceAllocation
    drv.pagelocked_empty = lambda shape, dtype: np.zeros(shape, dtype)
    drv.memcpy_htod_async, drv.memcpy_dtoh_async = memcpy_htod_async, memcpy_dtoh_async
    return drv

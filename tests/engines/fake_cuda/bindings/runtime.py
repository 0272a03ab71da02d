"""A fake ``cuda.bindings.runtime`` that mirrors the real one's names and return tuples.

Every function returns ``(cudaError_t, value...)`` like cuda-python. "Device" memory is
real host memory (ctypes buffers), so copies and the fake TensorRT's kernels move real
bytes. Streams execute work immediately, except while capturing a graph: then work is
recorded and replayed by ``cudaGraphLaunch``. ``_STATE`` holds the calls made and the
failures a test asks for; it is private (not part of the mirrored API).
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidDevice = 101
    cudaErrorNoDevice = 100
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalState = 401
    cudaErrorNotReady = 600
    cudaErrorStreamCaptureUnsupported = 900
    cudaErrorStreamCaptureInvalidated = 901
    cudaErrorStreamCaptureUnmatched = 903


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStreamCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


class _Handle:
    def __init__(self, init_value: int = 0) -> None:
        self._value = int(init_value)

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value}>"


class cudaStream_t(_Handle):
    pass


class cudaEvent_t(_Handle):
    pass


class cudaGraph_t(_Handle):
    pass


class cudaGraphExec_t(_Handle):
    pass


@dataclass
class _Stream:
    capturing: bool = False
    invalidated: bool = False
    captured: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class _State:
    devices: int = 1
    device: int = 0  # set by cudaSetDevice
    calls: list[str] = field(default_factory=list)
    fail: dict[str, cudaError_t] = field(default_factory=dict)  # function name -> error
    invalidate_capture: bool = False  # work submitted during capture invalidates it
    device_mem: dict[int, Any] = field(default_factory=dict)
    host_mem: dict[int, Any] = field(default_factory=dict)
    streams: dict[int, _Stream] = field(default_factory=dict)
    events: dict[int, float | None] = field(default_factory=dict)
    graphs: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    execs: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    launches: int = 0
    last_error: cudaError_t = cudaError_t.cudaSuccess
    ids: Any = field(default_factory=lambda: itertools.count(1))

    def submit(self, stream: int, work: Callable[[], None]) -> None:
        """Run ``work`` on ``stream`` now, or record it when the stream is capturing."""
        s = self.streams[int(stream)] if int(stream) else _Stream()
        if s.capturing:
            if self.invalidate_capture:
                s.invalidated = True
            s.captured.append(work)
        else:
            work()

    def is_capturing(self, stream: int) -> bool:
        return int(stream) in self.streams and self.streams[int(stream)].capturing

    def in_block(self, table: dict[int, Any], ptr: int, count: int) -> bool:
        return any(base <= ptr and ptr + count <= base + len(buf) for base, buf in table.items())


_STATE = _State()
_S = cudaError_t.cudaSuccess


def _reset(devices: int = 1) -> _State:
    global _STATE
    _STATE = _State(devices=devices)
    return _STATE


def _enter(name: str) -> cudaError_t | None:
    _STATE.calls.append(name)
    err = _STATE.fail.get(name)
    if err is not None:
        _STATE.last_error = err
    return err


def cudaGetDeviceCount():
    if _enter("cudaGetDeviceCount") or not _STATE.devices:
        return (cudaError_t.cudaErrorNoDevice, 0)
    return (_S, _STATE.devices)


def cudaGetErrorName(error):
    return (_S, cudaError_t(error).name.encode())


def cudaGetErrorString(error):
    return (_S, f"fake error {cudaError_t(error).name}".encode())


def cudaGetLastError():
    err, _STATE.last_error = _STATE.last_error, _S
    return (err,)


def _alloc(table: dict[int, Any], name: str, size: int):
    if err := _enter(name):
        return (err, 0)
    buf = ctypes.create_string_buffer(int(size))
    table[ctypes.addressof(buf)] = buf
    return (_S, ctypes.addressof(buf))


def cudaMalloc(size):
    return _alloc(_STATE.device_mem, "cudaMalloc", size)


def cudaMallocHost(size):
    return _alloc(_STATE.host_mem, "cudaMallocHost", size)


def cudaFree(devPtr):
    if err := _enter("cudaFree"):
        return (err,)
    return (_S,) if _STATE.device_mem.pop(int(devPtr), None) is not None else (
        cudaError_t.cudaErrorInvalidValue,)


def cudaFreeHost(ptr):
    if err := _enter("cudaFreeHost"):
        return (err,)
    return (_S,) if _STATE.host_mem.pop(int(ptr), None) is not None else (
        cudaError_t.cudaErrorInvalidValue,)


def cudaMemcpyAsync(dst, src, count, kind, stream):
    if err := _enter("cudaMemcpyAsync"):
        return (err,)
    dst, src, count = int(dst), int(src), int(count)
    dev = _STATE.device_mem
    if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
        ok = _STATE.in_block(dev, dst, count) and not _STATE.in_block(dev, src, count)
    elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
        ok = _STATE.in_block(dev, src, count) and not _STATE.in_block(dev, dst, count)
    else:
        ok = False
    if not ok or int(stream) not in _STATE.streams:
        return (cudaError_t.cudaErrorInvalidValue,)
    _STATE.submit(int(stream), lambda: ctypes.memmove(dst, src, count))
    return (_S,)


def cudaStreamCreate():
    if err := _enter("cudaStreamCreate"):
        return (err, None)
    handle = next(_STATE.ids)
    _STATE.streams[handle] = _Stream()
    return (_S, cudaStream_t(handle))


def cudaStreamDestroy(stream):
    _enter("cudaStreamDestroy")
    return (_S,) if _STATE.streams.pop(int(stream), None) else (
        cudaError_t.cudaErrorInvalidResourceHandle,)


def cudaStreamSynchronize(stream):
    if err := _enter("cudaStreamSynchronize"):
        return (err,)
    s = _STATE.streams.get(int(stream))
    if s is None:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    return (cudaError_t.cudaErrorStreamCaptureUnsupported,) if s.capturing else (_S,)


def cudaEventCreate():
    if err := _enter("cudaEventCreate"):
        return (err, None)
    handle = next(_STATE.ids)
    _STATE.events[handle] = None
    return (_S, cudaEvent_t(handle))


def cudaEventRecord(event, stream):
    if err := _enter("cudaEventRecord"):
        return (err,)
    if int(event) not in _STATE.events or int(stream) not in _STATE.streams:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    if _STATE.is_capturing(int(stream)):
        return (cudaError_t.cudaErrorStreamCaptureUnsupported,)
    _STATE.events[int(event)] = time.perf_counter() * 1000.0
    return (_S,)


def cudaEventQuery(event):
    if err := _enter("cudaEventQuery"):
        return (err,)
    return (_S,) if _STATE.events.get(int(event)) is not None else (
        cudaError_t.cudaErrorInvalidResourceHandle,)


def cudaSetDevice(device):
    if err := _enter("cudaSetDevice"):
        return (err,)
    if not 0 <= int(device) < _STATE.devices:
        return (cudaError_t.cudaErrorInvalidDevice,)
    _STATE.device = int(device)
    return (_S,)


def cudaEventSynchronize(event):
    _enter("cudaEventSynchronize")
    return (_S,) if _STATE.events.get(int(event)) is not None else (
        cudaError_t.cudaErrorInvalidResourceHandle,)


def cudaEventElapsedTime(start, end):
    _enter("cudaEventElapsedTime")
    a, b = _STATE.events.get(int(start)), _STATE.events.get(int(end))
    if a is None or b is None:
        return (cudaError_t.cudaErrorInvalidResourceHandle, 0.0)
    return (_S, b - a)


def cudaEventDestroy(event):
    _enter("cudaEventDestroy")
    return (_S,) if _STATE.events.pop(int(event), "gone") != "gone" else (
        cudaError_t.cudaErrorInvalidResourceHandle,)


def cudaStreamBeginCapture(stream, mode):
    if err := _enter("cudaStreamBeginCapture"):
        return (err,)
    s = _STATE.streams.get(int(stream))
    if s is None or s.capturing or not isinstance(mode, cudaStreamCaptureMode):
        return (cudaError_t.cudaErrorInvalidValue,)
    s.capturing, s.invalidated, s.captured = True, False, []
    return (_S,)


def cudaStreamEndCapture(stream):
    err = _enter("cudaStreamEndCapture")
    s = _STATE.streams.get(int(stream))
    if s is None or not s.capturing:
        return (cudaError_t.cudaErrorIllegalState, None)
    s.capturing = False
    if err or s.invalidated:
        return (err or cudaError_t.cudaErrorStreamCaptureInvalidated, None)
    handle = next(_STATE.ids)
    _STATE.graphs[handle] = list(s.captured)
    return (_S, cudaGraph_t(handle))


def cudaGraphInstantiate(graph, flags):
    if err := _enter("cudaGraphInstantiate"):
        return (err, None)
    if int(graph) not in _STATE.graphs:
        return (cudaError_t.cudaErrorInvalidValue, None)
    handle = next(_STATE.ids)
    _STATE.execs[handle] = list(_STATE.graphs[int(graph)])
    return (_S, cudaGraphExec_t(handle))


def cudaGraphLaunch(graphExec, stream):
    if err := _enter("cudaGraphLaunch"):
        return (err,)
    work = _STATE.execs.get(int(graphExec))
    if work is None or int(stream) not in _STATE.streams:
        return (cudaError_t.cudaErrorInvalidResourceHandle,)
    _STATE.launches += 1
    for item in work:
        _STATE.submit(int(stream), item)
    return (_S,)


def cudaGraphExecDestroy(graphExec):
    _enter("cudaGraphExecDestroy")
    return (_S,) if _STATE.execs.pop(int(graphExec), None) is not None else (
        cudaError_t.cudaErrorInvalidValue,)


def cudaGraphDestroy(graph):
    _enter("cudaGraphDestroy")
    return (_S,) if _STATE.graphs.pop(int(graph), None) is not None else (
        cudaError_t.cudaErrorInvalidValue,)

"""CUDA memory, streams, events and graphs for the TensorRT runner.

cuda-python (``cuda.bindings.runtime``, what NVIDIA's own samples use since TensorRT 10.14)
first; pycuda as a fallback (no CUDA graphs there). Both are imported on first use only.
Every cuda-python call returns ``(err, value...)``; :meth:`CudaPython._check` turns a
non-success code into :class:`CudaError` naming the call.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from trtqat.engines.errors import INSTALL_HINT, BackendUnavailableError, CudaError

log = logging.getLogger(__name__)


class HostBuffer:
    """Page-locked host memory with a numpy view."""

    def __init__(self, ptr: int, nbytes: int, array: np.ndarray | None = None) -> None:
        self.ptr = int(ptr)
        self.nbytes = nbytes
        if array is None:
            cptr = ctypes.cast(ctypes.c_void_p(self.ptr), ctypes.POINTER(ctypes.c_uint8))
            array = np.ctypeslib.as_array(cptr, (max(nbytes, 1),))
        self.bytes = array

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The first ``prod(shape)`` elements as an array of ``dtype``."""
        count = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.bytes[:count].view(dtype).reshape(shape)


class CudaApi(ABC):
    """The few CUDA runtime operations the runners need."""

    name = ""
    supports_graphs = False

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def alloc_host(self, nbytes: int) -> HostBuffer: ...

    @abstractmethod
    def free_host(self, buf: HostBuffer) -> None: ...

    @abstractmethod
    def alloc_device(self, nbytes: int) -> int: ...

    @abstractmethod
    def free_device(self, ptr: int) -> None: ...

    @abstractmethod
    def create_stream(self) -> Any: ...

    @abstractmethod
    def stream_handle(self, stream: Any) -> int: ...

    @abstractmethod
    def destroy_stream(self, stream: Any) -> None: ...

    @abstractmethod
    def synchronize(self, stream: Any) -> None: ...

    @abstractmethod
    def copy_htod(self, dst: int, src: HostBuffer, nbytes: int, stream: Any) -> None: ...

    @abstractmethod
    def copy_dtoh(self, dst: HostBuffer, src: int, nbytes: int, stream: Any) -> None: ...

    @abstractmethod
    def create_event(self) -> Any: ...

    @abstractmethod
    def record(self, event: Any, stream: Any) -> None: ...

    @abstractmethod
    def event_synchronize(self, event: Any) -> None: ...

    @abstractmethod
    def event_query(self, event: Any) -> bool:
        """True once the work before ``event`` is done (no blocking)."""

    def wait_event(self, event: Any, spin: bool = False) -> None:
        """Block until ``event`` completes; ``spin`` polls instead (trtexec --useSpinWait)."""
        if not spin:
            self.event_synchronize(event)
            return
        while not self.event_query(event):
            pass

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    @abstractmethod
    def destroy_event(self, event: Any) -> None: ...

    def begin_capture(self, stream: Any) -> None:
        raise CudaError(f"{self.name} cannot capture CUDA graphs")

    def end_capture(self, stream: Any) -> Any:
        raise CudaError(f"{self.name} cannot capture CUDA graphs")

    def instantiate(self, graph: Any) -> Any:
        raise CudaError(f"{self.name} cannot capture CUDA graphs")

    def launch(self, graph_exec: Any, stream: Any) -> None:
        raise CudaError(f"{self.name} cannot launch CUDA graphs")

    def destroy_graph(self, graph: Any, graph_exec: Any) -> None:
        return None

    def clear_error(self) -> None:
        return None

    def select_device(self) -> None:
        """Make ``self.device`` current (called once by :func:`load_cuda`)."""
        return None

    def close(self) -> None:
        return None


class CudaPython(CudaApi):
    """cuda-python's ``cuda.bindings.runtime``."""

    name = "cuda-python"
    supports_graphs = True

    def __init__(self, rt: Any, device: int = 0) -> None:
        self.rt = rt
        self.device = device

    def select_device(self) -> None:
        """``cudaSetDevice`` (trtexec --device)."""
        self._check("cudaSetDevice", self.rt.cudaSetDevice(self.device))

    def _check(self, call: str, result: Any) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            name = self.rt.cudaGetErrorName(err)[1]
            text = self.rt.cudaGetErrorString(err)[1]
            name = name.decode() if isinstance(name, bytes) else str(name)
            text = text.decode() if isinstance(text, bytes) else str(text)
            raise CudaError(f"{call} failed: {name} ({text})")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def device_count(self) -> int:
        err, count = self.rt.cudaGetDeviceCount()
        return int(count) if err == self.rt.cudaError_t.cudaSuccess else 0

    def alloc_host(self, nbytes: int) -> HostBuffer:
        return HostBuffer(self._check("cudaMallocHost", self.rt.cudaMallocHost(max(nbytes, 1))),
                          nbytes)

    def free_host(self, buf: HostBuffer) -> None:
        self._check("cudaFreeHost", self.rt.cudaFreeHost(buf.ptr))

    def alloc_device(self, nbytes: int) -> int:
        return int(self._check("cudaMalloc", self.rt.cudaMalloc(max(nbytes, 1))))

    def free_device(self, ptr: int) -> None:
        self._check("cudaFree", self.rt.cudaFree(ptr))

    def create_stream(self) -> Any:
        return self._check("cudaStreamCreate", self.rt.cudaStreamCreate())

    def stream_handle(self, stream: Any) -> int:
        return int(stream)

    def destroy_stream(self, stream: Any) -> None:
        self._check("cudaStreamDestroy", self.rt.cudaStreamDestroy(stream))

    def synchronize(self, stream: Any) -> None:
        self._check("cudaStreamSynchronize", self.rt.cudaStreamSynchronize(stream))

    def copy_htod(self, dst: int, src: HostBuffer, nbytes: int, stream: Any) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(dst, src.ptr, nbytes, kind, stream))

    def copy_dtoh(self, dst: HostBuffer, src: int, nbytes: int, stream: Any) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(dst.ptr, src, nbytes, kind, stream))

    def create_event(self) -> Any:
        return self._check("cudaEventCreate", self.rt.cudaEventCreate())

    def record(self, event: Any, stream: Any) -> None:
        self._check("cudaEventRecord", self.rt.cudaEventRecord(event, stream))

    def event_synchronize(self, event: Any) -> None:
        self._check("cudaEventSynchronize", self.rt.cudaEventSynchronize(event))

    def event_query(self, event: Any) -> bool:
        (err,) = self.rt.cudaEventQuery(event)
        if err == self.rt.cudaError_t.cudaErrorNotReady:
            return False
        self._check("cudaEventQuery", (err,))
        return True

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._check("cudaEventElapsedTime", self.rt.cudaEventElapsedTime(start, end)))

    def destroy_event(self, event: Any) -> None:
        self._check("cudaEventDestroy", self.rt.cudaEventDestroy(event))

    def begin_capture(self, stream: Any) -> None:
        mode = self.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._check("cudaStreamBeginCapture", self.rt.cudaStreamBeginCapture(stream, mode))

    def end_capture(self, stream: Any) -> Any:
        return self._check("cudaStreamEndCapture", self.rt.cudaStreamEndCapture(stream))

    def instantiate(self, graph: Any) -> Any:
        return self._check("cudaGraphInstantiate", self.rt.cudaGraphInstantiate(graph, 0))

    def launch(self, graph_exec: Any, stream: Any) -> None:
        self._check("cudaGraphLaunch", self.rt.cudaGraphLaunch(graph_exec, stream))

    def destroy_graph(self, graph: Any, graph_exec: Any) -> None:
        if graph_exec is not None:
            self._check("cudaGraphExecDestroy", self.rt.cudaGraphExecDestroy(graph_exec))
        if graph is not None:
            self._check("cudaGraphDestroy", self.rt.cudaGraphDestroy(graph))

    def clear_error(self) -> None:
        self.rt.cudaGetLastError()


class Pycuda(CudaApi):
    """pycuda, with an explicit primary context (``pycuda.autoinit`` breaks under threads)."""

    name = "pycuda"

    def __init__(self, driver: Any, device: int = 0) -> None:
        self.drv = driver
        self.device = device
        self._keep: dict[int, Any] = {}
        self._ctx = None
        try:
            driver.init()
            self._count = int(driver.Device.count())
        except Exception:  # pycuda raises its own error types when there is no driver
            self._count = 0

    def select_device(self) -> None:
        """Push the primary context of device ``self.device``."""
        self._ctx = self.drv.Device(self.device).retain_primary_context()
        self._ctx.push()

    def device_count(self) -> int:
        return self._count

    def alloc_host(self, nbytes: int) -> HostBuffer:
        array = self.drv.pagelocked_empty(max(nbytes, 1), np.uint8)
        return HostBuffer(array.ctypes.data, nbytes, array)

    def free_host(self, buf: HostBuffer) -> None:
        buf.bytes = np.empty(0, np.uint8)

    def alloc_device(self, nbytes: int) -> int:
        alloc = self.drv.mem_alloc(max(nbytes, 1))
        self._keep[int(alloc)] = alloc
        return int(alloc)

    def free_device(self, ptr: int) -> None:
        alloc = self._keep.pop(ptr, None)
        if alloc is not None:
            alloc.free()

    def create_stream(self) -> Any:
        return self.drv.Stream()

    def stream_handle(self, stream: Any) -> int:
        return int(stream.handle)

    def destroy_stream(self, stream: Any) -> None:
        return None

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def copy_htod(self, dst: int, src: HostBuffer, nbytes: int, stream: Any) -> None:
        self.drv.memcpy_htod_async(dst, src.bytes[:nbytes], stream)

    def copy_dtoh(self, dst: HostBuffer, src: int, nbytes: int, stream: Any) -> None:
        self.drv.memcpy_dtoh_async(dst.bytes[:nbytes], src, stream)

    def create_event(self) -> Any:
        return self.drv.Event()

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def event_synchronize(self, event: Any) -> None:
        event.synchronize()

    def event_query(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(end.time_since(start))

    def destroy_event(self, event: Any) -> None:
        return None

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.pop()
            self._ctx = None


def load_cuda(prefer: str | None = None, device: int = 0) -> CudaApi:
    """cuda-python if installed, else pycuda, on CUDA device ``device`` (trtexec --device);
    a missing library or GPU is a user error."""
    errors = []
    for name in ([prefer] if prefer else ["cuda-python", "pycuda"]):
        try:
            if name == "cuda-python":
                api: CudaApi = CudaPython(importlib.import_module("cuda.bindings.runtime"), device)
            else:
                api = Pycuda(importlib.import_module("pycuda.driver"), device)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        count = api.device_count()
        if count < 1:
            raise CudaError(f"no CUDA device found (via {api.name}); the tensorrt backend needs an "
                            "NVIDIA GPU and driver: use --backend=ort on this machine")
        if not 0 <= device < count:
            raise CudaError(f"--device={device}: this machine has {count} CUDA device(s); use "
                            f"--device=0..{count - 1}")
        api.select_device()
        log.debug("CUDA through %s on device %d", api.name, device)
        return api
    raise BackendUnavailableError(f"neither cuda-python nor pycuda can be imported "
                                  f"({'; '.join(errors)}); {INSTALL_HINT}")

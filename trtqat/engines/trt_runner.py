"""Runs a TensorRT engine: pinned host buffers, device buffers, one stream, events, graphs.

A query is H2D copies -> ``execute_async_v3`` (or a CUDA graph launch) -> D2H copies on one
stream, timed with CUDA events; enqueue time is host wall-clock around the enqueue call.
As in trtexec, two queries are in flight while timing: query i+1 is enqueued before the
host waits for query i.
CUDA graphs are captured the way trtexec does it and fall back to plain enqueue (with a
warning) when capture fails.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trtqat.engines.base import Runner
from trtqat.engines.cuda import CudaApi, HostBuffer, load_cuda
from trtqat.engines.errors import CudaError, EngineError, OptionsError, ShapeError
from trtqat.engines.specs import format_shape
from trtqat.engines.timing import QueryTimes
from trtqat.engines.trt_lib import import_tensorrt, numpy_dtype, trt_major

if TYPE_CHECKING:
    from trtqat.engines.trt import TrtEngine

log = logging.getLogger(__name__)


@dataclass
class _Binding:
    name: str
    is_input: bool
    dtype: np.dtype
    shape: tuple[int, ...] = ()
    host: HostBuffer | None = None
    device: int = 0
    capacity: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def array(self) -> np.ndarray:
        assert self.host is not None
        return self.host.view(self.dtype, self.shape)


class TrtRunner(Runner):
    """Runs a :class:`TrtEngine` through cuda-python (or pycuda)."""

    # trtexec's default: two enqueues in flight per stream (the host enqueues query i+1
    # while the GPU runs query i).
    DEPTH_PER_STREAM = 2

    def __init__(self, engine: TrtEngine, cuda: CudaApi | None = None, device: int = 0,
                 spin_wait: bool = False, streams: int = 1) -> None:
        super().__init__(engine)
        if not isinstance(streams, int) or streams < 1:
            raise OptionsError(f"--infStreams must be an int >= 1, got {streams!r}")
        self._cuda_arg = cuda
        self.device = device
        self.spin_wait = spin_wait  # trtexec --useSpinWait: poll events instead of blocking
        # trtexec --infStreams: each stream has its own execution context and buffers
        self.streams = streams
        self.inflight_depth = self.DEPTH_PER_STREAM * streams
        self._lanes: list[TrtRunner] = [self]
        self._order: deque[TrtRunner] = deque()
        self._turn = 0
        self._pending: deque[tuple[list[Any], float, float]] = deque()
        self.graph_in_use = False
        trt = import_tensorrt()
        # trtexec's defaults: TensorRT 11 uses graphs and leaves transfers out, 10.x the reverse
        newer = trt_major(trt) >= 11
        self.default_cuda_graph = newer
        self.default_data_transfers = not newer

    # ---- activation ------------------------------------------------------------------
    def _activate_impl(self) -> None:
        trt = import_tensorrt()
        self.cuda = self._cuda_arg or load_cuda(device=self.device)
        self.trt_engine = self.engine.cuda_engine()
        self.context = self.trt_engine.create_execution_context()
        if self.context is None:
            raise CudaError("TensorRT could not create an execution context (out of GPU memory?)")
        self.stream = self.cuda.create_stream()
        self.handle = self.cuda.stream_handle(self.stream)
        self.bindings: dict[str, _Binding] = {}
        for index in range(self.trt_engine.num_io_tensors):
            name = self.trt_engine.get_tensor_name(index)
            is_input = self.trt_engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            dtype = numpy_dtype(trt, self.trt_engine.get_tensor_dtype(name))
            self.bindings[name] = _Binding(name, is_input, dtype)
        # events[0]: the timing base; then 4 per in-flight slot (start, H2D end, compute end, end)
        self.events = [self.cuda.create_event() for _ in range(1 + 4 * self.DEPTH_PER_STREAM)]
        self._graph = self._graph_exec = None

    def _deactivate_impl(self) -> None:
        cuda = self.cuda
        self._drop_graph()
        for binding in self.bindings.values():
            if binding.host is not None:
                cuda.free_host(binding.host)
            if binding.device:
                cuda.free_device(binding.device)
        for event in self.events:
            cuda.destroy_event(event)
        cuda.destroy_stream(self.stream)
        self.bindings, self.events, self.context = {}, [], None
        if self._cuda_arg is None:
            cuda.close()

    # ---- buffers ---------------------------------------------------------------------
    def _set_shapes(self, feed: dict[str, np.ndarray]) -> None:
        """Set input shapes, size buffers (growing only) and bind their addresses."""
        changed = False
        for name, array in feed.items():
            shape = tuple(array.shape)
            if self.bindings[name].shape != shape or not self.bindings[name].capacity:
                if not self.context.set_input_shape(name, shape):
                    raise ShapeError(f"TensorRT refused shape {format_shape(shape)} for input "
                                     f"'{name}'; rebuild with --minShapes/--maxShapes covering it")
                self.bindings[name].shape = shape
                changed = True
        for binding in self.bindings.values():
            if not binding.is_input:
                shape = tuple(int(d) for d in self.context.get_tensor_shape(binding.name))
                if any(d < 0 for d in shape):
                    raise EngineError(f"output '{binding.name}' has a data-dependent shape "
                                      f"{format_shape(shape)}, which this runner does not support")
                changed |= shape != binding.shape
                binding.shape = shape
            if binding.nbytes > binding.capacity or not binding.capacity:
                self._allocate(binding)
                changed = True
        if changed:
            self._drop_graph()  # tensor addresses / shapes changed: a graph must be re-captured

    def _allocate(self, binding: _Binding) -> None:
        cuda = self.cuda
        if binding.host is not None:
            cuda.free_host(binding.host)
        if binding.device:
            cuda.free_device(binding.device)
        binding.capacity = max(binding.nbytes, 1)
        binding.host = cuda.alloc_host(binding.capacity)
        binding.device = cuda.alloc_device(binding.capacity)
        if not self.context.set_tensor_address(binding.name, binding.device):
            raise CudaError(f"TensorRT refused the device address of '{binding.name}'")

    def _stage(self, feed: dict[str, np.ndarray]) -> None:
        for name, array in feed.items():
            np.copyto(self.bindings[name].array(), array)

    def _copy_in(self) -> None:
        for b in self.bindings.values():
            if b.is_input and b.nbytes:
                self.cuda.copy_htod(b.device, b.host, b.nbytes, self.stream)

    def _copy_out(self) -> None:
        for b in self.bindings.values():
            if not b.is_input and b.nbytes:
                self.cuda.copy_dtoh(b.host, b.device, b.nbytes, self.stream)

    def _enqueue(self, context: Any = None) -> None:
        if self._graph_exec is not None and context is None:
            self.cuda.launch(self._graph_exec, self.stream)
        elif not (context or self.context).execute_async_v3(self.handle):
            raise CudaError("TensorRT execute_async_v3 failed (see the TensorRT messages above)")

    def _outputs(self) -> dict[str, np.ndarray]:
        return {b.name: b.array().copy() for b in self.bindings.values() if not b.is_input}

    # ---- inference -------------------------------------------------------------------
    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._set_shapes(feed)
        self._stage(feed)
        self._copy_in()
        self._enqueue()
        self._copy_out()
        self.cuda.synchronize(self.stream)
        return self._outputs()

    # ---- CUDA graphs -----------------------------------------------------------------
    def _drop_graph(self) -> None:
        if self._graph is not None or self._graph_exec is not None:
            self.cuda.destroy_graph(self._graph, self._graph_exec)
        self._graph = self._graph_exec = None
        self.graph_in_use = False

    def capture_graph(self) -> bool:
        """trtexec's capture: enqueue once, then BeginCapture -> enqueue -> EndCapture ->
        Instantiate. On failure warn and keep plain enqueue; returns whether a graph is used."""
        cuda = self.cuda
        self._drop_graph()
        self._enqueue()  # outside capture: lets TensorRT finish shape-dependent setup
        cuda.synchronize(self.stream)
        if not cuda.supports_graphs:
            log.warning("CUDA graph capture needs cuda-python (%s has none); using plain "
                        "enqueue", cuda.name)
            return False
        graph = None
        try:
            cuda.begin_capture(self.stream)
            try:
                ok = self.context.execute_async_v3(self.handle)
            finally:
                graph = cuda.end_capture(self.stream)
            if not ok:
                raise CudaError("execute_async_v3 returned False during capture")
            self._graph, self._graph_exec = graph, cuda.instantiate(graph)
        except CudaError as exc:
            cuda.clear_error()
            if graph is not None:
                cuda.destroy_graph(graph, None)
            self._graph = self._graph_exec = None
            log.warning("CUDA graph capture failed (%s); falling back to plain enqueue", exc)
            return False
        self.graph_in_use = True
        return True

    # ---- timing ----------------------------------------------------------------------
    def _bench_setup_impl(self, feed: dict[str, np.ndarray], data_transfers: bool,
                          cuda_graph: bool) -> None:
        self._lanes, self._order, self._turn = [self], deque(), 0
        try:
            for _ in range(self.streams - 1):  # --infStreams: one more runner per stream
                lane = TrtRunner(self.engine, cuda=self.cuda, spin_wait=self.spin_wait)
                self._lanes.append(lane.activate())
            for lane in self._lanes:
                lane._setup_lane(feed, cuda_graph)
        except BaseException:
            self._bench_teardown_impl()
            raise
        self.graph_in_use = all(lane.graph_in_use for lane in self._lanes)

    def _setup_lane(self, feed: dict[str, np.ndarray], cuda_graph: bool) -> None:
        self._set_shapes(feed)
        self._stage(feed)
        self._copy_in()  # device inputs are valid even when queries skip transfers
        self.cuda.synchronize(self.stream)
        if cuda_graph:
            self.capture_graph()
        base = self.events[0]
        self.cuda.record(base, self.stream)
        self.cuda.event_synchronize(base)
        self._base_ms = time.perf_counter() * 1000.0
        self._slots = [self.events[1 + 4 * i:5 + 4 * i] for i in range(self.DEPTH_PER_STREAM)]
        self._next_slot = 0
        self._pending.clear()

    def _submit_impl(self, data_transfers: bool) -> None:
        """Enqueue one query on the next stream, round robin, without waiting for it."""
        lane = self._lanes[self._turn % len(self._lanes)]
        self._turn += 1
        lane._submit_one(data_transfers)
        self._order.append(lane)

    def _collect_impl(self) -> QueryTimes:
        """Wait for the oldest query in flight (on whichever stream) and return its times."""
        return self._order.popleft()._collect_one()

    def _submit_one(self, data_transfers: bool) -> None:
        cuda, ev = self.cuda, self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        cuda.record(ev[0], self.stream)
        if data_transfers:
            self._copy_in()
        cuda.record(ev[1], self.stream)
        enq_start = time.perf_counter() * 1000.0
        self._enqueue()
        enq_end = time.perf_counter() * 1000.0
        cuda.record(ev[2], self.stream)
        if data_transfers:
            self._copy_out()
        cuda.record(ev[3], self.stream)
        self._pending.append((ev, enq_start, enq_end))

    def _collect_one(self) -> QueryTimes:
        ev, enq_start, enq_end = self._pending.popleft()
        self.cuda.wait_event(ev[3], self.spin_wait)
        t0, t1, t2, t3 = (self._base_ms + self.cuda.elapsed_ms(self.events[0], e) for e in ev)
        return QueryTimes(enq_start, enq_end, t0, t1, t1, t2, t2, t3)

    def _query_impl(self, data_transfers: bool) -> QueryTimes:
        self._submit_one(data_transfers)
        return self._collect_one()

    def _bench_teardown_impl(self) -> None:
        lanes, self._lanes, self._order = self._lanes, [self], deque()
        for lane in lanes:
            if lane._pending:  # an error mid-run: let the stream finish before buffers change
                lane.cuda.synchronize(lane.stream)
                lane._pending.clear()
            lane._drop_graph()
            if lane is not self:
                lane.deactivate()

    def _profile_impl(self, feed: dict[str, np.ndarray], iterations: int) -> dict[str, float]:
        trt = import_tensorrt()
        self._set_shapes(feed)
        self._stage(feed)
        self._copy_in()

        class _LayerTimes(trt.IProfiler):
            def __init__(self) -> None:
                trt.IProfiler.__init__(self)
                self.totals: dict[str, float] = defaultdict(float)

            def report_layer_time(self, layer_name: str, ms: float) -> None:
                self.totals[layer_name] += ms

        profiler = _LayerTimes()
        context = self.trt_engine.create_execution_context()  # a separate, profiled context
        context.profiler = profiler
        for binding in self.bindings.values():
            if binding.is_input:
                context.set_input_shape(binding.name, binding.shape)
            context.set_tensor_address(binding.name, binding.device)
        for _ in range(iterations):
            self._enqueue(context)
            self.cuda.synchronize(self.stream)
        return dict(sorted(((k, v / iterations) for k, v in profiler.totals.items()),
                           key=lambda kv: -kv[1]))

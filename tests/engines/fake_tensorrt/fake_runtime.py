"""Run-side classes of the fake TensorRT (runtime, engine, execution context)."""

from __future__ import annotations

import base64
import ctypes
import json
import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx

from .core import _PLAN_MAGIC, Dims, _dims


def define(c: SimpleNamespace) -> dict[str, Any]:
    """The runtime classes; ``c`` also holds the builder classes."""
    Severity, TensorIOMode = c.Severity, c.TensorIOMode
    ProfilingVerbosity, LayerInformationFormat = c.ProfilingVerbosity, c.LayerInformationFormat
    record, fail, version = c.record, c.fail, c.version
    _check_logger, _io_tensors, _np_dtype = c._check_logger, c._io_tensors, c._np_dtype
    IHostMemory, ITensor = c.IHostMemory, c.ITensor

    class IProfiler:
        def __init__(self) -> None:
            pass

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            raise NotImplementedError

    class ICudaEngine:
        def __init__(self, meta: dict[str, Any]) -> None:
            self._meta = meta
            self._model = onnx.load_from_string(base64.b64decode(meta["onnx"]))
            ins, outs = _io_tensors(self._model)
            self._io = {t.name: t for t in ins + outs}
            self._order = [t.name for t in ins + outs]
            self._session: Any = None

        num_io_tensors = property(lambda self: len(self._order))
        num_optimization_profiles = property(lambda self: 1)

        def _tensor(self, name: str) -> ITensor:
            if name not in self._io:
                raise KeyError(f"no tensor named {name!r}")
            return self._io[name]

        def get_tensor_name(self, index: int) -> str:
            return self._order[index]

        def get_tensor_mode(self, name: str) -> Any:
            if self._tensor(name).is_network_input:
                return TensorIOMode.INPUT
            return TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return self._tensor(name).dtype

        def get_tensor_shape(self, name: str) -> Dims:
            return self._tensor(name).shape

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
            if not self._tensor(name).is_network_input or profile_index != 0:
                raise ValueError(f"get_tensor_profile_shape({name!r}, {profile_index})")
            return [Dims(s) for s in self._meta["shapes"][name]]

        @property
        def profiling_verbosity(self) -> Any:
            return ProfilingVerbosity[self._meta.get("profiling_verbosity", "LAYER_NAMES_ONLY")]

        def create_engine_inspector(self) -> EngineInspector:
            record("ICudaEngine.create_engine_inspector")
            return EngineInspector(self)

        def create_execution_context(self) -> IExecutionContext | None:
            record("ICudaEngine.create_execution_context")
            return None if fail.get("context") else IExecutionContext(self)

        def serialize(self) -> IHostMemory:
            return IHostMemory(_PLAN_MAGIC + json.dumps(self._meta).encode())

        def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            if self._session is None:
                import onnxruntime

                so = onnxruntime.SessionOptions()
                so.log_severity_level = 3
                self._session = onnxruntime.InferenceSession(self._model.SerializeToString(), so)
            return self._session.run(None, feed)

    class EngineInspector:
        """Layer information as TensorRT's inspector gives it: names only, or one JSON
        object per layer when the engine was built with ProfilingVerbosity.DETAILED."""

        def __init__(self, engine: ICudaEngine) -> None:
            self._engine, self._context = engine, None

        @property
        def execution_context(self) -> Any:
            return self._context

        @execution_context.setter
        def execution_context(self, context: Any) -> None:
            if not isinstance(context, IExecutionContext):
                raise TypeError("execution_context must be an IExecutionContext")
            self._context = context

        def _layer(self, node: Any) -> Any:
            verbosity = self._engine.profiling_verbosity
            if verbosity == ProfilingVerbosity.DETAILED:
                return {"Name": node.name, "LayerType": node.op_type,
                        "Inputs": [{"Name": i} for i in node.input],
                        "Outputs": [{"Name": o} for o in node.output]}
            return node.name

        def get_layer_information(self, layer: int, format: Any) -> str:  # noqa: A002
            if not isinstance(format, LayerInformationFormat):
                raise TypeError("format must be a LayerInformationFormat")
            info = self._layer(self._engine._model.graph.node[layer])
            return json.dumps(info) if format == LayerInformationFormat.JSON else str(info)

        def get_engine_information(self, format: Any) -> str:  # noqa: A002
            if not isinstance(format, LayerInformationFormat):
                raise TypeError("format must be a LayerInformationFormat")
            record("EngineInspector.get_engine_information", format.name)
            layers = ([] if self._engine.profiling_verbosity == ProfilingVerbosity.NONE
                      else [self._layer(n) for n in self._engine._model.graph.node])
            if format == LayerInformationFormat.ONELINE:
                return "".join(f"{layer}\n" for layer in layers)
            return json.dumps({"Layers": layers, "Bindings": list(self._engine._order)})

    class Runtime:
        def __init__(self, logger: Any) -> None:
            _check_logger(logger, "Runtime")
            record("Runtime")
            self._logger = logger

        def deserialize_cuda_engine(self, serialized_engine: Any) -> ICudaEngine | None:
            record("Runtime.deserialize_cuda_engine")
            blob = bytes(serialized_engine)
            try:
                if not blob.startswith(_PLAN_MAGIC):
                    raise ValueError("magic")
                meta = json.loads(blob[len(_PLAN_MAGIC):])
            except ValueError:
                self._logger.log(Severity.ERROR, "invalid plan")
                return None
            if meta["version"] != version:
                self._logger.log(Severity.ERROR, "The engine plan file is not compatible with "
                                 f"this version of TensorRT ({meta['version']} vs {version})")
                return None
            return ICudaEngine(meta)

    class IExecutionContext:
        def __init__(self, engine: ICudaEngine) -> None:
            self._engine = engine
            self._shapes: dict[str, Dims] = {}
            self._addresses: dict[str, int] = {}
            self._profiler: IProfiler | None = None
            self._out_shapes: dict[tuple, dict[str, Dims]] = {}

        engine = property(lambda self: self._engine)

        @property
        def profiler(self) -> IProfiler | None:
            return self._profiler

        @profiler.setter
        def profiler(self, value: Any) -> None:
            if not isinstance(value, IProfiler):
                raise TypeError("profiler must be an IProfiler")
            self._profiler = value

        def set_input_shape(self, name: str, shape: Any) -> bool:
            dims = _dims(shape, f"set_input_shape({name})")
            record("IExecutionContext.set_input_shape", name, tuple(dims))
            tensor = self._engine._tensor(name)
            if not tensor.is_network_input:
                return False
            lo, _, hi = self._engine._meta["shapes"][name]
            if len(dims) != len(lo) or not all(a <= d <= b for a, d, b in zip(lo, dims, hi)):
                return False
            self._shapes[name] = dims
            return True

        def _input_key(self) -> tuple | None:
            names = [n for n in self._engine._order if self._engine._io[n].is_network_input]
            if any(n not in self._shapes for n in names):
                return None
            return tuple((n, self._shapes[n]) for n in names)

        def get_tensor_shape(self, name: str) -> Dims:
            tensor = self._engine._tensor(name)
            if tensor.is_network_input:
                return self._shapes.get(name, tensor.shape)
            key = self._input_key()
            if key is None:
                return tensor.shape
            if key not in self._out_shapes:
                feed = {n: np.zeros(s, _np_dtype(self._engine._io[n].dtype)) for n, s in key}
                outs = self._engine._run(feed)
                names = [n for n in self._engine._order if not self._engine._io[n].is_network_input]
                self._out_shapes[key] = {n: Dims(o.shape) for n, o in zip(names, outs)}
            return self._out_shapes[key][name]

        def set_tensor_address(self, name: str, memory: int) -> bool:
            if not isinstance(memory, int) or isinstance(memory, bool):
                raise TypeError(f"set_tensor_address({name!r}, memory: int), got {type(memory)}")
            record("IExecutionContext.set_tensor_address", name)
            if name not in self._engine._io or memory == 0:
                return False
            self._addresses[name] = memory
            return True

        def get_tensor_address(self, name: str) -> int:
            return self._addresses.get(name, 0)

        def execute_async_v3(self, stream_handle: int) -> bool:
            if not isinstance(stream_handle, int) or isinstance(stream_handle, bool):
                raise TypeError(f"execute_async_v3(stream_handle: int), got {type(stream_handle)}")
            record("IExecutionContext.execute_async_v3", stream_handle)
            key = self._input_key()
            if fail.get("execute") or key is None or set(self._addresses) != set(self._engine._io):
                return False
            io, engine = self._engine._io, self._engine
            out_shapes = {n: self.get_tensor_shape(n) for n in io if not io[n].is_network_input}
            addresses = dict(self._addresses)
            profiler = self._profiler

            def work() -> None:
                feed = {}
                for name, shape in key:
                    dtype = _np_dtype(io[name].dtype)
                    nbytes = int(np.prod(shape)) * dtype.itemsize
                    raw = ctypes.string_at(addresses[name], nbytes)
                    feed[name] = np.frombuffer(raw, dtype).reshape(shape)
                start = time.perf_counter()
                outs = engine._run(feed)
                ms = (time.perf_counter() - start) * 1000.0
                names = [n for n in engine._order if not io[n].is_network_input]
                for name, out in zip(names, outs):
                    out = np.ascontiguousarray(out, _np_dtype(io[name].dtype))
                    assert tuple(out.shape) == tuple(out_shapes[name])
                    ctypes.memmove(addresses[name], out.ctypes.data, out.nbytes)
                if profiler is not None:
                    nodes = engine._model.graph.node
                    for node in nodes:
                        profiler.report_layer_time(node.name or node.op_type, ms / len(nodes))

            runtime = sys.modules.get("cuda.bindings.runtime")
            state = getattr(runtime, "_STATE", None)
            if state is not None and stream_handle in state.streams:
                state.submit(stream_handle, work)
            else:
                work()
            return True

    return dict(locals())

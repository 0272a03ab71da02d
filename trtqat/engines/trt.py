"""TensorRT backend (TensorRT 10 and 11): build a plan from ONNX, save it, load it.

TensorRT 11 networks are always strongly typed: precision comes from the ONNX (Q/DQ pairs,
FP16 tensors), so precision builder flags are set only where the running TensorRT has them
(10.x), including the FP8/INT4 flags a file with FP8 Q/DQ or INT4 weights needs there (see
``trt_precision``). ``tensorrt`` is imported on first use; the runner lives in ``trt_runner``.

Naming convention (tests/engines/api_scan.py relies on it to check every TensorRT name used
here against the API lists): ``trt`` is the module, ``builder``/``network``/``config`` the
builder objects, ``cuda_engine`` an ICudaEngine and ``context`` an IExecutionContext.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from trtqat.engines.base import Builder, Engine, Runner
from trtqat.engines.errors import (
    INSTALL_HINT,
    BackendUnavailableError,
    EngineBuildError,
    EngineFileError,
)
from trtqat.engines.fileformat import KIND_ONNX, atomic_write
from trtqat.engines.onnx_io import read_onnx_bytes
from trtqat.engines.qformats import quant_formats
from trtqat.engines.specs import BuildOptions, TensorSpec
from trtqat.engines.trt_lib import import_tensorrt, numpy_dtype, trt_major
from trtqat.engines.trt_precision import apply_plan, plan_precision

log = logging.getLogger(__name__)

def make_logger(trt: Any, verbose: bool = False) -> Any:
    """A TensorRT logger at WARNING (VERBOSE with ``verbose``)."""
    return trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)


def network_flags(trt: Any, options: BuildOptions, strongly_typed: bool | None = None) -> int:
    """``create_network`` flags: 0 in TensorRT 11 (always strongly typed; the enum value of
    STRONGLY_TYPED changed, so it is never hard-coded); opt-in strong typing in 10
    (``strongly_typed`` overrides ``options.strongly_typed``)."""
    if trt_major(trt) >= 11:
        return 0
    if options.strongly_typed if strongly_typed is None else strongly_typed:
        return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return 0


def engine_io_specs(trt: Any,
                    cuda_engine: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs (with profile 0's min/opt/max) and outputs of a deserialized engine."""
    inputs, outputs = [], []
    for index in range(cuda_engine.num_io_tensors):
        name = cuda_engine.get_tensor_name(index)
        dtype = numpy_dtype(trt, cuda_engine.get_tensor_dtype(name)).name
        shape = tuple(None if d < 0 else int(d) for d in cuda_engine.get_tensor_shape(name))
        if cuda_engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            lo, opt, hi = (tuple(int(d) for d in dims)
                           for dims in cuda_engine.get_tensor_profile_shape(name, 0))
            inputs.append(TensorSpec(name, dtype, shape, lo, opt, hi))
        else:
            outputs.append(TensorSpec(name, dtype, shape))
    return tuple(inputs), tuple(outputs)


def deserialize(trt: Any, plan: bytes, verbose: bool = False) -> Any:
    """``Runtime.deserialize_cuda_engine``; None (wrong version, damaged plan) is an error."""
    runtime = trt.Runtime(make_logger(trt, verbose))
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise EngineFileError(f"TensorRT {trt.__version__} could not deserialize the plan (built "
                              "by another TensorRT version or damaged); rebuild it from the ONNX")
    return engine


class TrtEngine(Engine):
    """A serialized TensorRT plan (saved as a plain plan) plus trtqat's metadata."""

    backend = "tensorrt"

    def __init__(self, payload: bytes, header: Mapping[str, Any], cuda_engine: Any = None) -> None:
        super().__init__(payload, header)
        self._cuda_engine = cuda_engine

    def cuda_engine(self) -> Any:
        """The deserialized ``ICudaEngine`` (deserialized once, on first use)."""
        if self._cuda_engine is None:
            trt = import_tensorrt()
            self._cuda_engine = deserialize(trt, self.payload, self.build_options.verbose)
        return self._cuda_engine

    @classmethod
    def _check_version(cls, path: Path, header: Mapping[str, Any]) -> None:
        trt = import_tensorrt()
        built = str(header.get("backend_version", "?"))
        if built != str(trt.__version__):
            raise EngineFileError(f"{path} was built with TensorRT {built}, this is "
                                  f"{trt.__version__}; plans only run on the TensorRT that built "
                                  "them: rebuild it from the ONNX with 'trtqat build'")

    @classmethod
    def _load_plain(cls, path: Path, data: bytes, kind: str) -> Engine:
        """A plain plan (from ``trtexec --saveEngine`` or a sidecar-less trtqat build): its
        inputs, outputs and profile come from the deserialized engine."""
        if kind == KIND_ONNX:
            raise EngineFileError(f"{path} is an ONNX model, not a TensorRT plan: build an "
                                  f"engine from it with --onnx={path} --backend=tensorrt")
        try:
            trt = import_tensorrt()
        except BackendUnavailableError:
            raise BackendUnavailableError(
                f"{path} is not an ONNX model and has no trtqat sidecar; reading it as a "
                f"TensorRT plan needs TensorRT: {INSTALL_HINT} (needs an NVIDIA GPU)") from None
        try:
            cuda_engine = deserialize(trt, data)
        except EngineFileError:
            raise EngineFileError(f"{path} is neither an ONNX model nor a TensorRT "
                                  f"{trt.__version__} plan (foreign, damaged, or built by "
                                  "another TensorRT); rebuild it with 'trtqat build'") from None
        inputs, outputs = engine_io_specs(trt, cuda_engine)
        header = {"backend_version": str(trt.__version__), "source": str(path),
                  "inputs": [s.to_json() for s in inputs],
                  "outputs": [s.to_json() for s in outputs], "build_options": {},
                  "sidecar": False}
        return cls(data, header, cuda_engine)

    def _layer_info_impl(self, verbosity: str) -> dict[str, Any]:
        """The engine inspector's JSON (the verbosity is the one the plan was built with)."""
        trt = import_tensorrt()
        inspector = self.cuda_engine().create_engine_inspector()
        return json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))

    def _runner_impl(self, **kwargs: Any) -> Runner:
        from trtqat.engines.trt_runner import TrtRunner

        return TrtRunner(self, **kwargs)


class TrtBuilder(Builder):
    """Builds :class:`TrtEngine` objects with the TensorRT builder and ONNX parser."""

    backend = "tensorrt"
    dynamic_default_one = True

    def _build_impl(self, path: Path, model: onnx.ModelProto,
                    inputs: tuple[TensorSpec, ...]) -> TrtEngine:
        trt = import_tensorrt()
        options = self.options
        precision = plan_precision(trt, options, quant_formats(model), path)
        for line in precision.warnings:
            log.warning(line)
        for line in precision.infos:
            log.info(line)
        net_flags = network_flags(trt, options, precision.strongly_typed)
        logger = make_logger(trt, options.verbose)
        builder = trt.Builder(logger)
        network = builder.create_network(net_flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(read_onnx_bytes(path), str(path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise EngineBuildError(f"TensorRT's ONNX parser rejected {path} ({len(errors)} "
                                   f"error(s)): {' | '.join(errors) or 'no details'}")
        config = builder.create_builder_config()
        pools = {"workspace": trt.MemoryPoolType.WORKSPACE,
                 "tacticSharedMem": trt.MemoryPoolType.TACTIC_SHARED_MEMORY}
        for pool, size in options.memory_pools.items():
            config.set_memory_pool_limit(pools[pool], size)
        if options.builder_optimization_level is not None:
            config.builder_optimization_level = options.builder_optimization_level
        config.profiling_verbosity = {"layer_names_only": trt.ProfilingVerbosity.LAYER_NAMES_ONLY,
                                      "detailed": trt.ProfilingVerbosity.DETAILED,
                                      "none": trt.ProfilingVerbosity.NONE,
                                      }[options.profiling_verbosity]
        apply_plan(trt, config, precision)
        cache = self._attach_timing_cache(config)
        self._add_profile(trt, builder, network, config, inputs)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise EngineBuildError(f"TensorRT could not build an engine from {path} (see the "
                                   "TensorRT messages above; --verbose shows more)")
        if cache is not None and options.timing_cache:
            atomic_write(options.timing_cache, bytes(config.get_timing_cache().serialize()))
        payload = bytes(plan)
        cuda_engine = deserialize(trt, payload, options.verbose)
        engine_inputs, engine_outputs = engine_io_specs(trt, cuda_engine)
        header = self.base_header(path, engine_inputs, engine_outputs, str(trt.__version__),
                                  ignored=precision.ignored)
        header.update(network_flags=net_flags, builder_flags=list(precision.flags),
                      strongly_typed=precision.strongly_typed or trt_major(trt) >= 11)
        return TrtEngine(payload, header, cuda_engine)

    def _attach_timing_cache(self, config: Any) -> Any:
        if not self.options.timing_cache:
            return None
        cache_file = Path(self.options.timing_cache)
        blob = cache_file.read_bytes() if cache_file.is_file() else b""
        cache = config.create_timing_cache(blob)
        if not config.set_timing_cache(cache, False):
            log.warning("timing cache %s does not match this TensorRT/GPU; starting a new one",
                        cache_file)
            cache = config.create_timing_cache(b"")
            config.set_timing_cache(cache, True)
        return cache

    def _add_profile(self, trt: Any, builder: Any, network: Any, config: Any,
                     inputs: Sequence[TensorSpec]) -> None:
        specs = {spec.name: spec for spec in inputs}
        profile = builder.create_optimization_profile()
        dynamic = 0
        for index in range(network.num_inputs):
            tensor = network.get_input(index)
            if all(d >= 0 for d in tensor.shape):
                continue
            spec = specs.get(tensor.name)
            if spec is None or not spec.has_profile:
                raise EngineBuildError(f"TensorRT input '{tensor.name}' is dynamic but has no "
                                       "shapes; pass --minShapes/--optShapes/--maxShapes")
            profile.set_shape(tensor.name, spec.min_shape, spec.opt_shape, spec.max_shape)
            dynamic += 1
        if dynamic:
            config.add_optimization_profile(profile)

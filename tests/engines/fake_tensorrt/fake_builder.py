"""Build-side classes of the fake TensorRT (network, parser, config, builder)."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

import onnx

from .core import _CACHE_MAGIC, _PLAN_MAGIC, Dims, _dims, _np_of


def define(c: SimpleNamespace) -> dict[str, Any]:
    """The builder classes, closing over the flavour's enums and call log ``c``."""
    Severity, DataType, MemoryPoolType = c.Severity, c.DataType, c.MemoryPoolType
    BuilderFlag, NetworkDefinitionCreationFlag = c.BuilderFlag, c.NetworkDefinitionCreationFlag
    ProfilingVerbosity = c.ProfilingVerbosity
    record, fail, version, major = c.record, c.fail, c.version, c.major
    to_trt, _check_logger = c.to_trt, c._check_logger

    class ITensor:
        def __init__(self, name: str, shape: Dims, dtype: Any, is_input: bool) -> None:
            self._name, self._shape, self._dtype, self._is_input = name, shape, dtype, is_input

        name = property(lambda self: self._name)
        shape = property(lambda self: self._shape)
        dtype = property(lambda self: self._dtype)
        is_network_input = property(lambda self: self._is_input)

    def _io_tensors(model: onnx.ModelProto) -> tuple[list[ITensor], list[ITensor]]:
        inits = {i.name for i in model.graph.initializer}

        def tensor(v: onnx.ValueInfoProto, is_input: bool) -> ITensor:
            tt = v.type.tensor_type
            shape = Dims(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
            return ITensor(v.name, shape, to_trt[_np_of(tt.elem_type)], is_input)

        return ([tensor(v, True) for v in model.graph.input if v.name not in inits],
                [tensor(v, False) for v in model.graph.output])

    class INetworkDefinition:
        def __init__(self, flags: int) -> None:
            self._flags, self._model = flags, None
            self._inputs: list[ITensor] = []
            self._outputs: list[ITensor] = []

        num_inputs = property(lambda self: len(self._inputs))
        num_outputs = property(lambda self: len(self._outputs))

        def get_input(self, index: int) -> ITensor:
            return self._inputs[index]

        def get_output(self, index: int) -> ITensor:
            return self._outputs[index]

    class ParserError:
        def __init__(self, desc: str, node: int = -1, node_name: str = "") -> None:
            self._desc, self._node, self._node_name = desc, node, node_name

        def desc(self) -> str:
            return self._desc

        def node(self) -> int:
            return self._node

        def node_name(self) -> str:
            return self._node_name

        def __str__(self) -> str:
            return f"In node {self._node} with name: {self._node_name}: {self._desc}"

    class OnnxParser:
        def __init__(self, network: Any, logger: Any) -> None:
            if not isinstance(network, INetworkDefinition):
                raise TypeError("OnnxParser(network, logger): network must be INetworkDefinition")
            _check_logger(logger, "OnnxParser")
            record("OnnxParser")
            self._network, self._errors = network, []

        def parse(self, model: Any, path: str | None = None) -> bool:
            record("OnnxParser.parse", path)
            if not isinstance(model, (bytes, bytearray, memoryview)):
                raise TypeError(f"OnnxParser.parse(model): expected a buffer, got {type(model)}")
            if "parse" in fail:
                self._errors = [ParserError(d, i, f"node{i}") for i, d in enumerate(fail["parse"])]
                return False
            try:
                proto = onnx.load_from_string(bytes(model))
                if not proto.graph.node:
                    raise ValueError("empty graph")
            except Exception:
                self._errors = [ParserError("Failed to parse ONNX model")]
                return False
            self._network._model = proto
            self._network._inputs, self._network._outputs = _io_tensors(proto)
            return True

        num_errors = property(lambda self: len(self._errors))

        def get_error(self, index: int) -> ParserError:
            return self._errors[index]

        def clear_errors(self) -> None:
            self._errors = []

    class IHostMemory(bytes):
        nbytes = property(lambda self: len(self))
        dtype = property(lambda self: DataType.UINT8)

    class ITimingCache:
        def __init__(self, entries: int, valid: bool) -> None:
            self._entries, self._valid = entries, valid

        def serialize(self) -> IHostMemory:
            record("ITimingCache.serialize")
            return IHostMemory(_CACHE_MAGIC + str(self._entries).encode())

    class IOptimizationProfile:
        def __init__(self) -> None:
            self._shapes: dict[str, tuple[Dims, Dims, Dims]] = {}

        def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:  # noqa: A002
            record("IOptimizationProfile.set_shape", input, tuple(min), tuple(opt), tuple(max))
            shapes = tuple(_dims(s, f"set_shape({input})") for s in (min, opt, max))
            self._shapes[input] = shapes  # type: ignore[assignment]

        def get_shape(self, input: str) -> list[Dims]:  # noqa: A002
            return list(self._shapes[input])

        def __bool__(self) -> bool:
            return all(len(a) == len(b) == len(c) and all(x <= y <= z for x, y, z in zip(a, b, c))
                       for a, b, c in self._shapes.values())

    class IBuilderConfig:
        def __init__(self) -> None:
            self._pools: dict[Any, int] = {}
            self._flags: set[Any] = set()
            self._level = 3
            self._profiles: list[IOptimizationProfile] = []
            self._cache: ITimingCache | None = None
            self._verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY

        @property
        def profiling_verbosity(self) -> Any:
            return self._verbosity

        @profiling_verbosity.setter
        def profiling_verbosity(self, value: Any) -> None:
            if not isinstance(value, ProfilingVerbosity):
                raise TypeError(f"profiling_verbosity: expected ProfilingVerbosity, got {value!r}")
            record("IBuilderConfig.profiling_verbosity", value.name)
            self._verbosity = value

        def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
            if not isinstance(pool, MemoryPoolType) or not isinstance(pool_size, int):
                raise TypeError("set_memory_pool_limit(pool: MemoryPoolType, pool_size: int)")
            record("IBuilderConfig.set_memory_pool_limit", pool.name, pool_size)
            self._pools[pool] = pool_size

        def get_memory_pool_limit(self, pool: Any) -> int:
            return self._pools.get(pool, 1 << 40)

        @property
        def builder_optimization_level(self) -> int:
            return self._level

        @builder_optimization_level.setter
        def builder_optimization_level(self, level: int) -> None:
            if not isinstance(level, int) or not 0 <= level <= 5:
                raise ValueError(f"builder_optimization_level must be 0..5, got {level!r}")
            record("IBuilderConfig.builder_optimization_level", level)
            self._level = level

        def set_flag(self, flag: Any) -> None:
            if not isinstance(flag, BuilderFlag):
                raise TypeError(f"set_flag: expected BuilderFlag, got {flag!r}")
            record("IBuilderConfig.set_flag", flag.name)
            self._flags.add(flag)

        def get_flag(self, flag: Any) -> bool:
            return flag in self._flags

        def clear_flag(self, flag: Any) -> None:
            self._flags.discard(flag)

        def create_timing_cache(self, serialized_timing_cache: Any) -> ITimingCache:
            blob = bytes(serialized_timing_cache)
            record("IBuilderConfig.create_timing_cache", len(blob))
            if blob.startswith(_CACHE_MAGIC):
                return ITimingCache(int(blob[len(_CACHE_MAGIC):] or b"0"), True)
            return ITimingCache(0, not blob)

        def set_timing_cache(self, cache: Any, ignore_mismatch: bool) -> bool:
            if not isinstance(cache, ITimingCache) or not isinstance(ignore_mismatch, bool):
                raise TypeError("set_timing_cache(cache: ITimingCache, ignore_mismatch: bool)")
            record("IBuilderConfig.set_timing_cache", ignore_mismatch)
            if not cache._valid and not ignore_mismatch:
                return False
            self._cache = cache
            return True

        def get_timing_cache(self) -> ITimingCache | None:
            return self._cache

        def add_optimization_profile(self, profile: Any) -> int:
            if not isinstance(profile, IOptimizationProfile):
                raise TypeError("add_optimization_profile(profile: IOptimizationProfile)")
            record("IBuilderConfig.add_optimization_profile")
            if not profile:
                return -1
            self._profiles.append(profile)
            return len(self._profiles) - 1

        num_optimization_profiles = property(lambda self: len(self._profiles))

    class Builder:
        def __init__(self, logger: Any) -> None:
            _check_logger(logger, "Builder")
            record("Builder")
            self._logger = logger

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            record("Builder.create_network", flags)
            if not isinstance(flags, int) or isinstance(flags, bool):
                raise TypeError(f"create_network(flags: int), got {flags!r}")
            valid = sum(1 << int(m) for m in NetworkDefinitionCreationFlag)
            if flags & ~valid:
                raise ValueError(f"create_network: unknown flag bits {flags:#x}")
            return INetworkDefinition(flags)

        def create_builder_config(self) -> IBuilderConfig:
            record("Builder.create_builder_config")
            return IBuilderConfig()

        def create_optimization_profile(self) -> IOptimizationProfile:
            record("Builder.create_optimization_profile")
            return IOptimizationProfile()

        def build_serialized_network(self, network: Any, config: Any) -> IHostMemory | None:
            if not isinstance(network, INetworkDefinition) or not isinstance(config,
                                                                              IBuilderConfig):
                raise TypeError("build_serialized_network(network, config)")
            record("Builder.build_serialized_network")
            log = self._logger.log
            if network._model is None or fail.get("build"):
                log(Severity.ERROR, "build failed")
                return None
            problem = _precision_problem(network, config)
            if problem:
                log(Severity.ERROR, problem)
                return None
            profile = config._profiles[0] if config._profiles else None
            shapes = {}
            for tensor in network._inputs:
                if all(d >= 0 for d in tensor.shape):
                    shapes[tensor.name] = [list(tensor.shape)] * 3
                    continue
                if profile is None or tensor.name not in profile._shapes:
                    log(Severity.ERROR, f"Network has dynamic or shape inputs, but no "
                        f"optimization profile has been defined ({tensor.name})")
                    return None
                lo, opt, hi = profile._shapes[tensor.name]
                for dims in (lo, opt, hi):
                    if len(dims) != len(tensor.shape) or any(
                            s >= 0 and s != d for s, d in zip(tensor.shape, dims)):
                        log(Severity.ERROR, f"profile shape {dims} does not fit {tensor.name}")
                        return None
                shapes[tensor.name] = [list(lo), list(opt), list(hi)]
            if config._cache is not None:
                config._cache._entries += len(network._model.graph.node)
            meta = {"version": version, "flags": network._flags, "shapes": shapes,
                    "builder_flags": sorted(f.name for f in config._flags),
                    "profiling_verbosity": config._verbosity.name,
                    "onnx": base64.b64encode(network._model.SerializeToString()).decode()}
            return IHostMemory(_PLAN_MAGIC + json.dumps(meta).encode())

    strongly_bit = (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)
                    if hasattr(NetworkDefinitionCreationFlag, "STRONGLY_TYPED") else 0)
    precision_flags = [getattr(BuilderFlag, n) for n in ("FP16", "BF16", "INT8", "FP8", "INT4")
                       if hasattr(BuilderFlag, n)]

    def _precision_problem(network: INetworkDefinition, config: IBuilderConfig) -> str | None:
        """What TensorRT 10 refuses: precision flags in a strongly typed network
        (NVIDIA/TensorRT#4253), FP8/INT4 weights or zero points in a weakly typed one without
        their builder flag. TensorRT 11 has neither (always strongly typed, no such flags)."""
        if major >= 11:
            return None
        if network._flags & strongly_bit:
            for flag in precision_flags:
                if flag in config._flags:
                    return ("IBuilder::buildSerializedNetwork: Error Code 3: API Usage Error "
                            f"(Parameter check failed, condition: !config.getFlag(BuilderFlag::"
                            f"k{flag.name}). )")
            return None
        types = {t.data_type for t in network._model.graph.initializer}
        for onnx_type, name in ((onnx.TensorProto.FLOAT8E4M3FN, "FP8"),
                                (onnx.TensorProto.INT4, "INT4")):
            if onnx_type in types and getattr(BuilderFlag, name, None) not in config._flags:
                return f"{name} Q/DQ in a weakly typed network needs BuilderFlag::k{name}"
        return None

    if major < 11:
        Builder.platform_has_fast_fp16 = property(lambda self: True)
        Builder.platform_has_fast_int8 = property(lambda self: True)
    return dict(locals())

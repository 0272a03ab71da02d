"""The TensorRT code and the fakes stay inside the real APIs.

* every TensorRT attribute trtqat/engines/trt*.py touches is in the TensorRT 11 API list, or
  in the 10 list on a code path guarded for TensorRT 10;
* every name the fake tensorrt exposes is in the list of its flavour;
* every name the fake cuda.bindings.runtime exposes exists in the real cuda-python, with the
  same parameters and enum values.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
from pathlib import Path

import pytest

import trtqat.engines

from .api_scan import is_known, scan
from .fake_cuda.bindings import runtime as fake_rt
from .fake_tensorrt import api_names, make_module

ENGINES = Path(trtqat.engines.__file__).parent
TRT_SOURCES = [ENGINES / "trt.py", ENGINES / "trt_runner.py", ENGINES / "trt_lib.py",
               ENGINES / "trt_precision.py"]
CORE = {"Builder.create_network", "OnnxParser.parse", "OnnxParser.get_error",
        "OnnxParser.num_errors", "Builder.create_builder_config",
        "IBuilderConfig.set_memory_pool_limit", "IBuilderConfig.builder_optimization_level",
        "IBuilderConfig.create_timing_cache", "IBuilderConfig.set_timing_cache",
        "IBuilderConfig.get_timing_cache", "ITimingCache.serialize",
        "Builder.create_optimization_profile", "IOptimizationProfile.set_shape",
        "IBuilderConfig.add_optimization_profile", "Builder.build_serialized_network",
        "Runtime.deserialize_cuda_engine", "ICudaEngine.num_io_tensors",
        "ICudaEngine.get_tensor_name", "ICudaEngine.get_tensor_mode",
        "ICudaEngine.get_tensor_dtype", "ICudaEngine.get_tensor_profile_shape",
        "ICudaEngine.create_execution_context", "IExecutionContext.set_input_shape",
        "IExecutionContext.get_tensor_shape", "IExecutionContext.set_tensor_address",
        "IExecutionContext.execute_async_v3", "IExecutionContext.profiler",
        "INetworkDefinition.num_inputs", "INetworkDefinition.get_input", "ITensor.shape",
        "ITensor.name", "BuilderFlag.FP16", "BuilderFlag.INT8", "BuilderFlag.FP8",
        "BuilderFlag.INT4", "Logger.WARNING",
        "NetworkDefinitionCreationFlag.STRONGLY_TYPED", "MemoryPoolType.WORKSPACE",
        "IBuilderConfig.profiling_verbosity", "ProfilingVerbosity.DETAILED",
        "ICudaEngine.create_engine_inspector", "EngineInspector.get_engine_information",
        "LayerInformationFormat.JSON"}


def test_trt_sources_use_only_the_tensorrt_api() -> None:
    api11, api10 = api_names(11), api_names(10)
    accesses = [a for path in TRT_SOURCES for a in scan(path.read_text())]
    names = {a.name for a in accesses}
    assert CORE <= names, f"the scan lost track of: {sorted(CORE - names)}"
    bad = []
    for access in accesses:
        if is_known(access.name, api11):
            continue
        if access.guarded_10 and is_known(access.name, api10):
            continue
        where = "TensorRT 10 only, unguarded" if is_known(access.name, api10) else "unknown"
        bad.append(f"line {access.line}: {access.name} ({where})")
    assert not bad, bad
    flags = [a for a in accesses if a.name in ("BuilderFlag.FP16", "BuilderFlag.INT8",
                                               "BuilderFlag.FP8", "BuilderFlag.INT4")]
    assert flags and all(a.guarded_10 for a in flags)


def test_scan_catches_wrong_names_and_unguarded_trt10_code() -> None:
    source = '''
def build(trt, options):
    builder = trt.Builder(make_logger(trt))
    network = builder.create_netwrok(0)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    if hasattr(trt.BuilderFlag, "FP16"):
        config.set_flag(trt.BuilderFlag.FP16)
    engine = trt.Runtime(make_logger(trt)).deserialize_cuda_engine(b"")
    engine.get_binding_shape(0)
'''
    api11, api10 = api_names(11), api_names(10)
    found = {(a.name, a.guarded_10) for a in scan(source)}
    assert ("Builder.create_netwrok", False) in found
    assert ("BuilderFlag.INT8", False) in found and ("BuilderFlag.FP16", True) in found
    assert ("ICudaEngine.get_binding_shape", False) in found
    assert not is_known("Builder.create_netwrok", api10)
    assert not is_known("BuilderFlag.INT8", api11) and is_known("BuilderFlag.INT8", api10)
    assert not is_known("ICudaEngine.get_binding_shape", api11)  # removed in TensorRT 10


@pytest.mark.parametrize("version", ["10.16.0.72", "11.4.0.106"])
def test_fake_tensorrt_exposes_only_real_names(version: str) -> None:
    module = make_module(version)
    api = api_names(int(version.split(".")[0]))
    exposed = []
    for name in dir(module):
        if name.startswith("_"):
            continue
        exposed.append(name)
        value = getattr(module, name)
        if isinstance(value, type) and issubclass(value, enum.Enum):
            exposed += [f"{name}.{m}" for m in value.__members__]
        elif isinstance(value, type):
            exposed += [f"{name}.{attr}" for attr in vars(value) if not attr.startswith("_")]
    unknown = [n for n in exposed if not is_known(n, api)]
    assert not unknown, unknown
    assert len(exposed) > 100


def test_fake_flavours_differ_where_tensorrt_does() -> None:
    ten, eleven = make_module("10.16.0.72"), make_module("11.4.0.106")
    assert hasattr(ten.BuilderFlag, "INT8") and not hasattr(eleven.BuilderFlag, "INT8")
    assert hasattr(ten.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH")
    assert not hasattr(eleven.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH")
    assert int(ten.NetworkDefinitionCreationFlag.STRONGLY_TYPED) != int(
        eleven.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def _doc_params(func) -> list[str]:
    first = (func.__doc__ or "").strip().splitlines()[0]
    inside = re.fullmatch(r"\w+\((.*)\)", first)
    assert inside, first
    params = [p.strip() for p in inside[1].split(",") if p.strip()]
    return [p.split(":")[0].split()[-1] for p in params]


def test_fake_cuda_runtime_mirrors_cuda_python() -> None:
    try:
        real = importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        pytest.skip("cuda-python is not installed")
    assert getattr(real, "_STATE", None) is None, "the fake is installed in sys.modules"
    checked = 0
    for name, value in vars(fake_rt).items():
        if name.startswith("_") or getattr(value, "__module__", None) != fake_rt.__name__:
            continue
        assert hasattr(real, name), name
        if inspect.isfunction(value):
            assert list(inspect.signature(value).parameters) == _doc_params(getattr(real, name))
        elif isinstance(value, type) and issubclass(value, enum.Enum):
            for member in value:
                assert int(getattr(getattr(real, name), member.name)) == int(member), member
        checked += 1
    assert checked >= 30

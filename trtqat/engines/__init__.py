"""Engines: build, save, load and run ONNX models with ONNX Runtime or TensorRT.

    from trtqat.engines import benchmark, build_engine, load_engine
    engine = build_engine("model.onnx", "ort", shapes={"input": (1, 3, 224, 224)},
                          out="engines/model.engine")
    with load_engine("engines/model.engine").runner() as runner:
        outputs = runner.infer({"input": x})
    result = benchmark("engines/model.engine", inputs={"input": x}, duration=1.0)
    print("\\n".join(result.summary_lines()))

Importing this package never imports tensorrt, pycuda or cuda-python, nor touches CUDA:
backends load on first use.
"""

from trtqat.engines.base import Builder, Engine, Runner, random_feed
from trtqat.engines.bench import benchmark
from trtqat.engines.errors import (
    BackendUnavailableError,
    CudaError,
    EngineBuildError,
    EngineError,
    EngineFileError,
    EngineRunError,
    InputError,
    ModelFileError,
    OptionsError,
    ShapeError,
)
from trtqat.engines.registry import (
    BackendInfo,
    backend_info,
    backend_names,
    build_engine,
    builder_class,
    canonical_backend,
    engine_class,
    load_engine,
)
from trtqat.engines.specs import BuildOptions, TensorSpec, parse_shapes
from trtqat.engines.timing import BenchmarkResult, BenchmarkSettings, QueryTimes

__all__ = [
    "BackendInfo", "BackendUnavailableError", "BenchmarkResult", "BenchmarkSettings", "BuildOptions", "Builder",
    "CudaError", "Engine", "EngineBuildError", "EngineError", "EngineFileError", "EngineRunError",
    "InputError",
    "ModelFileError", "OptionsError", "QueryTimes", "Runner", "ShapeError", "TensorSpec",
    "backend_info", "backend_names", "benchmark", "build_engine", "builder_class",
    "canonical_backend", "engine_class", "load_engine", "parse_shapes", "random_feed",
]

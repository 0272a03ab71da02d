"""ONNX Runtime backend: the engine is ORT's optimised model (a plain ``.onnx``) plus a sidecar.

Building runs the ONNX through an optional ``prepare_model`` step (e.g. the Q/DQ
re-encoding of ``trtqat.engines.ort_qdq``), then lets ORT optimise it (level ALL) and
saves the optimised model (``optimized_model_filepath``). CPU by default; CUDA and TensorRT
execution providers when the installed onnxruntime has them. Every build runs one inference
before it returns (:mod:`trtqat.engines.ort_run`); the same inputs give the same engine bytes.
"""

from __future__ import annotations

import importlib
import logging
import platform
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from trtqat.atomic import probe_write
from trtqat.engines.base import Builder, Engine, Runner
from trtqat.engines.errors import BackendUnavailableError, EngineBuildError, EngineFileError
from trtqat.engines.fileformat import KIND_ONNX
from trtqat.engines.onnx_io import (
    FP16_QDQ_FUSIONS,
    has_float16,
    onnx_input_specs,
    onnx_output_specs,
    ort_disabled_optimizers,
)
from trtqat.engines.ort_run import first_inference, layer_times, ort_call
from trtqat.engines.specs import (
    PRECISION_FLAGS,
    PROVIDERS,
    BuildOptions,
    TensorSpec,
    precision_note,
)
from trtqat.engines.timing import QueryTimes
from trtqat.threads import cpu_threads

log = logging.getLogger(__name__)

PrepareStep = Callable[[onnx.ModelProto, BuildOptions], onnx.ModelProto]
# Named model transforms applied before the ORT session is created ("module:function",
# imported lazily). trtqat.engines.ort_qdq re-encodes TensorRT-style Q/DQ for ORT's CPU kernels.
PREPARE_STEPS: dict[str, str | PrepareStep] = {"qdq": "trtqat.engines.ort_qdq:prepare_model"}
_COMPILING_PROVIDERS = {"tensorrt"}  # ORT cannot save a model holding compiled nodes


def register_prepare_step(name: str, step: PrepareStep) -> None:
    """Make ``BuildOptions(ort_prepare=name)`` run ``step(model, options)`` before ORT."""
    PREPARE_STEPS[name] = step


def prepare_model(model: onnx.ModelProto, options: BuildOptions) -> onnx.ModelProto:
    """The hook run before session creation: identity unless ``options.ort_prepare`` names
    a step in :data:`PREPARE_STEPS`."""
    name = options.ort_prepare
    if name == "auto":  # integer kernels only pay off on the CPU provider
        name = "qdq" if tuple(options.providers) == ("cpu",) else None
    if not name or name == "none":
        return model
    step = PREPARE_STEPS.get(name)
    if step is None:
        raise EngineBuildError(f"unknown ORT prepare step '{name}'; known: auto, none, "
                               f"{', '.join(sorted(PREPARE_STEPS))}")
    if isinstance(step, str):
        module_name, _, func_name = step.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            raise EngineBuildError(f"ORT prepare step '{options.ort_prepare}' needs {module_name},"
                                   " which this trtqat does not have yet") from None
        step = getattr(module, func_name)
    prepared = step(model, options)
    if not isinstance(prepared, onnx.ModelProto):
        raise TypeError(f"prepare step {options.ort_prepare} returned {type(prepared).__name__}")
    return prepared


def import_ort() -> Any:
    """onnxruntime, imported on first use."""
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailableError("onnxruntime is not installed; pip install 'trtqat[ort]' "
                                      "(or 'trtqat[ort-gpu]' for the CUDA and TensorRT "
                                      "providers)") from None
    return onnxruntime


def _major(version: str) -> str:
    return str(version).split(".")[0]


def _providers(ort: Any, options: BuildOptions,
               device: int = 0) -> list[tuple[str, dict[str, str]]]:
    available = ort.get_available_providers()
    out = []
    for short in options.providers:
        name = PROVIDERS[short]
        if name not in available:
            raise BackendUnavailableError(
                f"ONNX Runtime provider {name} is not available (this onnxruntime has "
                f"{', '.join(available)}); install onnxruntime-gpu or use --providers=cpu")
        opts: dict[str, str] = {"device_id": str(device)} if short != "cpu" else {}
        if short == "cuda" and options.cuda_graph:
            opts["enable_cuda_graph"] = "1"
        if short == "tensorrt":
            int8, fp16 = options.int8 or options.best, options.fp16 or options.best
            cache = Path(tempfile.gettempdir()) / "trtqat-ort-trt-cache"
            opts.update(trt_int8_enable=str(int(int8)), trt_fp16_enable=str(int(fp16)),
                        trt_engine_cache_enable="1", trt_engine_cache_path=str(cache))
            if options.cuda_graph:
                opts["trt_cuda_graph_enable"] = "1"
            if options.timing_cache:
                opts.update(trt_timing_cache_enable="1",
                            trt_timing_cache_path=str(Path(options.timing_cache).parent))
            if options.builder_optimization_level is not None:
                opts["trt_builder_optimization_level"] = str(options.builder_optimization_level)
            if "workspace" in options.memory_pools:
                opts["trt_max_workspace_size"] = str(options.memory_pools["workspace"])
        out.append((name, opts))
    if not any(name == "CPUExecutionProvider" for name, _ in out):
        out.append(("CPUExecutionProvider", {}))  # fallback for nodes other EPs do not take
    return out


def _session_options(ort: Any, options: BuildOptions, threads: int | None = None) -> Any:
    so = ort.SessionOptions()
    level_type = ort.GraphOptimizationLevel
    levels = [level_type.ORT_DISABLE_ALL, level_type.ORT_ENABLE_BASIC,
              level_type.ORT_ENABLE_EXTENDED]
    level = options.builder_optimization_level
    so.graph_optimization_level = (levels[level] if level is not None and level < 3
                                   else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    # Severity 3 (ERROR) hides the one-warning-per-unused-initializer wall of text.
    so.log_severity_level = 1 if options.verbose else 3
    threads = options.threads if threads is None else threads
    threads = cpu_threads() if threads is None else threads  # --threads of the command
    if threads:
        so.intra_op_num_threads = threads
    # Masked attention scores underflow Softmax's exp into denormals, which are ~10x slower
    # on x86; flushing them to zero (as GPUs do) changes no result beyond 1e-38.
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    # DQ(int4 block) -> MatMul becomes MatMulNBits; level 1 keeps float32 activations (the
    # file's W4A16 maths; ORT's default 4 quantizes them to int8: faster, other numbers)
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    return so


def _create_session(ort: Any, model: bytes, so: Any, providers: list, what: str,
                    disabled: list[str] | None = None) -> Any:
    names = [name for name, _ in providers]
    try:
        return ort.InferenceSession(model, sess_options=so, providers=names,
                                    provider_options=[opts for _, opts in providers],
                                    disabled_optimizers=disabled or None)
    except Exception as exc:  # ORT raises its own pybind exception types (Fail, InvalidGraph...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EngineBuildError(f"ONNX Runtime could not load {what}: {first}") from None


class OrtEngine(Engine):
    """ORT's optimised model (the payload) plus inputs, providers and build options."""

    backend = "ort"

    @classmethod
    def _check_version(cls, path: Path, header: Mapping[str, Any]) -> None:
        ort = import_ort()
        built = str(header.get("backend_version", "?"))
        if _major(built) != _major(ort.__version__):
            raise EngineFileError(f"{path} was built with onnxruntime {built}, this is "
                                  f"{ort.__version__}; rebuild it from the ONNX with "
                                  "'trtqat build'")
        machine = header.get("machine")
        if header.get("optimized") and machine and machine != platform.machine():
            # level-ALL models hold layout-specific kernels (NCHWc): same kind of CPU only
            raise EngineFileError(f"{path} was optimised on {machine}, this is "
                                  f"{platform.machine()}; rebuild it here with 'trtqat build'")

    @classmethod
    def _load_plain(cls, path: Path, data: bytes, kind: str) -> OrtEngine:
        """A plain ONNX model (e.g. a saved engine whose sidecar is gone): CPU provider."""
        if kind != KIND_ONNX:
            raise EngineFileError(f"{path} is not an ONNX model; if it is a TensorRT plan, load "
                                  "it with --backend=tensorrt (backend='tensorrt')")
        model = onnx.load_from_string(data)
        header = {"backend_version": import_ort().__version__, "source": str(path),
                  "inputs": [s.to_json() for s in onnx_input_specs(model)],
                  "outputs": [s.to_json() for s in onnx_output_specs(model)],
                  "build_options": {}, "sidecar": False}
        return cls(data, header)

    def _layer_info_impl(self, verbosity: str) -> dict[str, Any]:
        """The optimised model's nodes as trtexec's layer information."""
        nodes = onnx.load_from_string(self.payload).graph.node
        names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)]
        layers: list[Any] = [] if verbosity == "none" else names
        if verbosity == "detailed":
            layers = [{"Name": name, "LayerType": n.op_type,
                       "Inputs": [{"Name": t} for t in n.input if t],
                       "Outputs": [{"Name": t} for t in n.output if t]}
                      for name, n in zip(names, nodes)]
        return {"Layers": layers, "Bindings": [s.name for s in self.inputs + self.outputs]}

    def _runner_impl(self, **kwargs: Any) -> OrtRunner:
        return OrtRunner(self, **kwargs)


class OrtBuilder(Builder):
    """Builds :class:`OrtEngine` objects."""

    backend = "ort"

    def _build_impl(self, path: Path, model: onnx.ModelProto,
                    inputs: tuple[TensorSpec, ...]) -> OrtEngine:
        ort = import_ort()
        options = self.options
        note = precision_note(options, "ONNX Runtime")
        ignored = PRECISION_FLAGS if note and "tensorrt" not in options.providers else ()
        if ignored:
            log.warning(note)
        if options.cuda_graph and not set(options.providers) & {"cuda", "tensorrt"}:
            ignored += ("cuda_graph",)  # CUDA graphs need a GPU provider
        if options.timing_cache and "tensorrt" not in options.providers:
            log.info("--timingCacheFile is ignored by the ort backend")
        from trtqat.engines.ort_nodes import is_qdq_model, node_summary

        qdq_source = is_qdq_model(model)
        model = prepare_model(model, options)
        reencoding = _reencoding(model)
        cpu_int8: dict[str, Any] = {}
        if tuple(options.providers) == ("cpu",):
            from trtqat.engines.ort_u8s8 import guard_model, u8s8_saturates

            model, cpu_int8 = guard_model(model, None if options.u8s8_guard else False)
            cpu_int8["kernels"] = "exact" if options.u8s8_guard else "fast"
            if not options.u8s8_guard:  # --cpuInt8=fast: what the CPU does, all the same
                cpu_int8["u8s8_saturates"] = u8s8_saturates()
                if cpu_int8["u8s8_saturates"]:
                    log.warning("--cpuInt8=fast: this CPU's uint8 x int8 kernels saturate (x86 "
                                "without VNNI); the engine may differ from the Q/DQ model "
                                "(--cpuInt8=exact keeps it exact)")
        providers = _providers(ort, options)
        so = _session_options(ort, options)
        compiled = any(p in _COMPILING_PROVIDERS for p in options.providers)
        with tempfile.TemporaryDirectory(prefix="trtqat-ort-") as tmp:
            optimized = Path(tmp) / "optimized.onnx"
            if not compiled:
                so.optimized_model_filepath = str(optimized)
            source = model.SerializeToString()
            disabled = ort_disabled_optimizers(model)
            try:
                session = _create_session(ort, source, so, providers, str(path), disabled)
            except EngineBuildError:
                if not compiled:  # ORT reports a full disk as INVALID_PROTOBUF: name it
                    probe_write(optimized, 2 * len(source) + (1 << 16), "no engine was "
                                "written (ONNX Runtime saves its optimised model there: set "
                                "TMPDIR to move it)")
                if not has_float16(model) or FP16_QDQ_FUSIONS in disabled:
                    raise
                log.info("%s: ONNX Runtime cannot load it with its Q/DQ fusions on float16 "
                         "scales; built without them", path)
                disabled = [*disabled, FP16_QDQ_FUSIONS]
                session = _create_session(ort, source, so, providers, str(path), disabled)
            payload = optimized.read_bytes() if not compiled else source
        # never hand out an engine that does not run: ORT checks some kernels only then
        ran_on = first_inference(session, inputs, options.calib_feeds, str(path),
                                 bool(reencoding))
        del session
        header = self.base_header(path, inputs, onnx_output_specs(model), ort.__version__,
                                  ignored=ignored)
        header.update(providers=[name for name, _ in providers], optimized=not compiled,
                      prepare=options.ort_prepare, machine=platform.machine(),
                      disabled_optimizers=disabled, cpu_int8=cpu_int8,
                      first_inference=ran_on)
        if reencoding:
            header["reencoding"] = reencoding
        if not compiled:
            header["compute_nodes"] = node_summary(onnx.load_from_string(payload), qdq_source)
        return OrtEngine(payload, header)


def _reencoding(model: onnx.ModelProto) -> dict[str, Any]:
    """``{"kind": "integer" | "faithful", "why": ...}`` of a CPU re-encoded model, else {}."""
    from trtqat.engines.ort_u8s8 import reencode_report

    report = reencode_report(model)
    if not report.get("rewritten"):
        return {}
    found: dict[str, Any] = {"kind": "integer"}
    if report.get("faithful"):
        found = {"kind": "faithful", "why": report.get("full_reencoding", "")}
    if report.get("verdict"):  # what the kind depended on (inputs, threshold, figures)
        found["verdict"] = report["verdict"]
    if report.get("pools_in_float"):
        found["pools_in_float"] = report["pools_in_float"]
    return found


class OrtRunner(Runner):
    """Runs an :class:`OrtEngine`; benchmark queries use IO binding with fixed buffers."""

    synchronous = True

    def __init__(self, engine: OrtEngine, threads: int | None = None, device: int = 0) -> None:
        super().__init__(engine)
        self.threads = threads
        self.device = device  # CUDA device of the cuda/tensorrt providers (trtexec --device)
        # compute is timed on the host clock: on the CPU, or around a GPU provider's run
        self.compute_label = ("CPU" if tuple(engine.build_options.providers) == ("cpu",)
                              else "Host")
        self.session: Any = None
        self.graph_in_use = False

    def _new_session(self, **so_attrs: Any) -> Any:
        ort = import_ort()
        options = self.engine.build_options
        so = _session_options(ort, options, self.threads)
        for key, value in so_attrs.items():
            setattr(so, key, value)
        return _create_session(ort, self.engine.payload, so,
                               _providers(ort, options, self.device), "the engine",
                               list(self.engine.header.get("disabled_optimizers") or []))

    def _activate_impl(self) -> None:
        self.session = self._new_session()
        self._output_names = [o.name for o in self.session.get_outputs()]

    def _deactivate_impl(self) -> None:
        self.session = None
        self._binding = None

    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = ort_call("the engine", self.session.run, self._output_names, feed)
        return dict(zip(self._output_names, outputs))

    def _bench_setup_impl(self, feed: dict[str, np.ndarray], data_transfers: bool,
                          cuda_graph: bool) -> None:
        ort = import_ort()
        if cuda_graph and not self.engine.build_options.cuda_graph:
            log.info("CUDA graphs apply to ORT only with --providers=cuda built with "
                     "--useCudaGraph; timing without")
        self.graph_in_use = bool(cuda_graph and self.engine.build_options.cuda_graph)
        self._feed = feed
        self._binding = self.session.io_binding()
        self._in_values = {}
        for name, array in feed.items():
            value = ort.OrtValue.ortvalue_from_numpy(array.copy())
            self._binding.bind_ortvalue_input(name, value)
            self._in_values[name] = value
        outputs = self._infer_impl(feed)  # learn output shapes, then bind fixed buffers
        self._out_values, self._host_out = {}, {}
        for name, array in outputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(np.empty_like(array))
            self._binding.bind_ortvalue_output(name, value)
            self._out_values[name] = value
            self._host_out[name] = np.empty_like(array)

    def _query_impl(self, data_transfers: bool) -> QueryTimes:
        clock = time.perf_counter
        t0 = clock()
        if data_transfers:
            for name, value in self._in_values.items():
                value.update_inplace(self._feed[name])
        t1 = clock()
        ort_call("the engine", self.session.run_with_iobinding, self._binding)
        t2 = clock()
        if data_transfers:
            for name, value in self._out_values.items():
                np.copyto(self._host_out[name], value.numpy())
        t3 = clock()
        t0, t1, t2, t3 = (t * 1000.0 for t in (t0, t1, t2, t3))
        return QueryTimes(t1, t2, t0, t1, t1, t2, t2, t3)

    def _bench_teardown_impl(self) -> None:
        self._binding = None
        self._in_values = self._out_values = {}

    def _profile_impl(self, feed: dict[str, np.ndarray], iterations: int) -> dict[str, float]:
        with tempfile.TemporaryDirectory(prefix="trtqat-prof-") as tmp:
            session = self._new_session(enable_profiling=True,
                                        profile_file_prefix=str(Path(tmp) / "ort"))
            for _ in range(iterations):
                ort_call("the engine", session.run, None, feed)
            return layer_times(Path(session.end_profiling()), iterations)

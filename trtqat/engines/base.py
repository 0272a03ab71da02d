"""Engine / Builder / Runner: the public API every backend shares.

Backends write only the ``_impl`` hooks; checking inputs (names, dtypes, shapes against the
engine's profile), the engine file format and timing live here, once.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx

from trtqat.engines.errors import EngineFileError, InputError, RunnerStateError, ShapeError
from trtqat.engines.fileformat import EngineFile, read_engine_files, write_engine_files
from trtqat.engines.onnx_io import has_float16, load_onnx, onnx_input_specs
from trtqat.engines.qformats import precision_name, quant_formats
from trtqat.engines.specs import BuildOptions, Shape, TensorSpec, format_shape, resolve_profile

if TYPE_CHECKING:
    from trtqat.engines.timing import BenchmarkResult, BenchmarkSettings, QueryTimes

log = logging.getLogger(__name__)
Feed = Mapping[str, Any]


class Engine(ABC):
    """A built engine: the backend's bytes plus a header describing inputs and options."""

    backend: ClassVar[str] = ""

    def __init__(self, payload: bytes, header: Mapping[str, Any]) -> None:
        self.payload = payload
        self.header = dict(header, backend=self.backend)
        self.inputs = tuple(TensorSpec.from_json(d) for d in self.header.get("inputs", ()))
        self.outputs = tuple(TensorSpec.from_json(d) for d in self.header.get("outputs", ()))
        self.path: Path | None = None  # the file it was loaded from or last saved to

    @property
    def build_options(self) -> BuildOptions:
        """The options the engine was built with (as saved in its header)."""
        known = {f.name for f in dataclasses.fields(BuildOptions)}
        data = {k: v for k, v in (self.header.get("build_options") or {}).items() if k in known}
        for key in ("shapes", "min_shapes", "opt_shapes", "max_shapes"):
            data[key] = {k: tuple(v) for k, v in (data.get(key) or {}).items()}
        data["providers"] = tuple(data.get("providers") or ("cpu",))
        data.pop("calib_feeds", None)  # only a count is stored
        return BuildOptions(**data)

    def input_spec(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise InputError(f"unknown input '{name}'; the engine's inputs are: "
                         f"{', '.join(s.name for s in self.inputs)}")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the plain engine (the backend's bytes, unchanged) and its ``.json`` sidecar,
        each atomically; returns the engine's path (also :attr:`path` from now on)."""
        self.path = write_engine_files(path, self.header, self.payload)
        return self.path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Engine:
        """Load an engine file of this backend, with or without its sidecar; another
        backend's or version's file, and foreign or damaged files, are refused."""
        return cls.from_file(read_engine_files(path))

    @classmethod
    def from_file(cls, found: EngineFile) -> Engine:
        """An engine from what :func:`read_engine_files` found."""
        path, header = found.path, found.header
        if header is None:
            engine = cls._load_plain(path, found.payload, found.kind)
        else:
            backend = header.get("backend")
            if backend != cls.backend:
                raise EngineFileError(f"{path} is a '{backend}' engine, not '{cls.backend}'; run "
                                      f"it with --backend={backend} (or backend='{backend}')")
            cls._check_version(path, header)
            engine = cls(found.payload, header)
        engine.path = Path(path)
        return engine

    @classmethod
    @abstractmethod
    def _load_plain(cls, path: Path, data: bytes, kind: str) -> Engine:
        """An engine from a file without trtqat metadata (kind: onnx or plan)."""

    @classmethod
    @abstractmethod
    def _check_version(cls, path: Path, header: Mapping[str, Any]) -> None:
        """Raise EngineFileError when the file was built by an incompatible backend version."""

    def layer_info(self, verbosity: str | None = None) -> dict[str, Any]:
        """trtexec's layer information, ``{"Layers": [...], "Bindings": [...]}``: layer names,
        or one object per layer at ``detailed`` verbosity (a TensorRT engine keeps the
        verbosity it was built with; ONNX Runtime takes ``verbosity`` when given)."""
        return self._layer_info_impl(verbosity or self.build_options.profiling_verbosity)

    def _layer_info_impl(self, verbosity: str) -> dict[str, Any]:
        raise InputError(f"the {self.backend} backend gives no layer information")

    def runner(self, **kwargs: Any) -> Runner:
        """A new (inactive) runner for this engine; use it as a context manager."""
        return self._runner_impl(**kwargs)

    @abstractmethod
    def _runner_impl(self, **kwargs: Any) -> Runner: ...

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self.inputs)
        return f"<{type(self).__name__} {self.header.get('backend_version', '')} inputs: {ins}>"


class Builder(ABC):
    """Builds an :class:`Engine` from an ONNX file with :class:`BuildOptions`."""

    backend: ClassVar[str] = ""
    # TensorRT needs a profile for every dynamic input (trtexec uses 1 for unknown dims).
    dynamic_default_one: ClassVar[bool] = False

    def __init__(self, options: BuildOptions | None = None, **option_kwargs: Any) -> None:
        if options is None:
            options = BuildOptions(**option_kwargs)
        elif option_kwargs:
            options = options.with_changes(**option_kwargs)
        self.options = options

    def build(self, onnx_path: str | os.PathLike[str]) -> Engine:
        """Check the ONNX file and the requested shapes, then build with the backend."""
        path = Path(onnx_path)
        model = load_onnx(path)
        inputs = resolve_profile(onnx_input_specs(model), self.options,
                                 dynamic_default_one=self.dynamic_default_one)
        engine = self._build_impl(path, model, inputs)
        # what the file holds (int8/fp8/int4 Q/DQ, fp16): the engine's precision
        formats = quant_formats(model)
        engine.header.update(quant_formats=list(formats),
                             precision=precision_name(formats, has_float16(model)))
        return engine

    @abstractmethod
    def _build_impl(self, path: Path, model: onnx.ModelProto,
                    inputs: tuple[TensorSpec, ...]) -> Engine: ...

    def base_header(self, path: Path, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], backend_version: str,
                    ignored: Sequence[str] = ()) -> dict[str, Any]:
        """The header fields every backend stores. ``ignored``: BuildOptions fields the
        backend did not apply (e.g. precision flags where precision comes from the ONNX):
        recorded as ``ignored_options`` and left at their defaults in ``build_options``, which
        says what the engine was built with."""
        from trtqat import __version__

        defaults = BuildOptions()
        applied = self.options.with_changes(**{k: getattr(defaults, k) for k in ignored})
        return {"ignored_options": sorted(k for k in ignored if getattr(self.options, k)),
            "backend": self.backend, "backend_version": backend_version,
            "trtqat_version": __version__, "source": str(path),
            "source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "inputs": [s.to_json() for s in inputs], "outputs": [s.to_json() for s in outputs],
            "build_options": applied.to_json(),
        }


class Runner(ABC):
    """Runs an engine: ``with engine.runner() as r: outputs = r.infer(feed)``.

    Public ``activate()/infer()/deactivate()`` wrap the backend hooks; input checking and
    timing (``benchmark``) live here.
    """

    # What trtexec of the matching generation does when the user says nothing.
    default_data_transfers: ClassVar[bool] = True
    default_cuda_graph: ClassVar[bool] = False
    # True where the run call returns only after compute (no asynchronous enqueue).
    synchronous: ClassVar[bool] = False
    # What the summary calls compute time: "GPU Compute Time", "CPU Compute Time", ...
    compute_label: ClassVar[str] = "GPU"
    # Queries in flight while timing (trtexec keeps two enqueued per stream on TensorRT).
    inflight_depth: ClassVar[int] = 1

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._active = False
        self._done: list[QueryTimes] = []

    @property
    def is_active(self) -> bool:
        return self._active

    def activate(self) -> Runner:
        """Create the session / execution context and buffers."""
        if self._active:
            raise RunnerStateError(f"{type(self).__name__} is already active; deactivate it first")
        self._activate_impl()
        self._active = True
        return self

    def deactivate(self) -> None:
        """Free what ``activate`` created (safe to call twice)."""
        if self._active:
            try:
                self._deactivate_impl()
            finally:
                self._active = False

    def __enter__(self) -> Runner:
        return self.activate()

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    def _require_active(self) -> None:
        if not self._active:
            raise RunnerStateError(f"{type(self).__name__} is not active; use 'with "
                                   "engine.runner() as runner:' or call activate() first")

    def check_feed(self, feed: Feed) -> dict[str, np.ndarray]:
        """Check names, dtypes and shapes; return contiguous numpy arrays in engine order."""
        if not isinstance(feed, Mapping):
            raise InputError("feed must be a dict of input name -> array, got "
                             f"{type(feed).__name__}")
        specs = {spec.name: spec for spec in self.engine.inputs}
        for name in feed:
            if name not in specs:
                raise InputError(f"unknown input '{name}'; the engine's inputs are: "
                                 f"{', '.join(specs)}")
        checked = {}
        for name, spec in specs.items():
            if name not in feed:
                raise InputError(f"input '{name}' is missing; the engine needs "
                                 f"{', '.join(s.describe() for s in specs.values())}")
            array = np.asarray(feed[name])
            if array.dtype != np.dtype(spec.dtype):
                raise InputError(f"input '{name}' is {array.dtype}, the engine expects "
                                 f"{spec.dtype}; convert it with .astype(np.{spec.dtype})")
            check_shape(spec, tuple(array.shape))
            checked[name] = np.ascontiguousarray(array)
        return checked

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run once; returns ``{output name: numpy array}``."""
        self._require_active()
        return self._infer_impl(self.check_feed(feed))

    def benchmark(self, feed: Feed, settings: BenchmarkSettings | None = None) -> BenchmarkResult:
        """Time repeated queries the way trtexec does (see :mod:`trtqat.engines.timing`)."""
        from trtqat.engines.timing import BenchmarkSettings, run_benchmark

        self._require_active()
        return run_benchmark(self, self.check_feed(feed), settings or BenchmarkSettings())

    def profile_layers(self, feed: Feed, iterations: int = 10) -> dict[str, float]:
        """Mean time per layer in ms over ``iterations`` runs (a separate, profiled run)."""
        self._require_active()
        return self._profile_impl(self.check_feed(feed), iterations)

    # ---- backend hooks -------------------------------------------------------------------
    @abstractmethod
    def _activate_impl(self) -> None: ...

    @abstractmethod
    def _deactivate_impl(self) -> None: ...

    @abstractmethod
    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def _bench_setup_impl(self, feed: dict[str, np.ndarray], data_transfers: bool,
                          cuda_graph: bool) -> None:
        """Fix shapes and buffers for repeated queries (and capture a CUDA graph)."""

    @abstractmethod
    def _query_impl(self, data_transfers: bool) -> QueryTimes:
        """One query; times in ms on ``time.perf_counter() * 1000``'s clock."""

    def _submit_impl(self, data_transfers: bool) -> None:
        """Enqueue one query (pipelined timing); default: run it now with ``_query_impl``."""
        self._done.append(self._query_impl(data_transfers))

    def _collect_impl(self) -> QueryTimes:
        """Wait for the oldest submitted query and return its times."""
        return self._done.pop(0)

    def _bench_teardown_impl(self) -> None:
        """Undo ``_bench_setup_impl`` (default: nothing)."""
        return None

    def _profile_impl(self, feed: dict[str, np.ndarray], iterations: int) -> dict[str, float]:
        raise InputError(f"the {self.engine.backend} backend has no per-layer profiler")


def check_shape(spec: TensorSpec, shape: Shape) -> None:
    """Raise a one-line error when ``shape`` does not fit the engine's input ``spec``."""
    name = spec.name
    if len(shape) != len(spec.shape):
        raise InputError(f"input '{name}' has shape {format_shape(shape)} (rank {len(shape)}), the "
                         f"engine expects {format_shape(spec.shape)} (rank {len(spec.shape)})")
    for axis, (want, got) in enumerate(zip(spec.shape, shape)):
        if want is not None and want != got:
            fix = ("re-export the ONNX with a dynamic batch axis and rebuild" if axis == 0
                   else f"feed {want} there")
            raise ShapeError(f"input '{name}' has shape {format_shape(shape)}, but dimension "
                             f"{axis} is fixed to {want} in this engine; {fix}")
    if spec.has_profile:
        lo, hi = spec.min_shape or (), spec.max_shape or ()
        if not all(a <= d <= b for a, d, b in zip(lo, shape, hi)):
            raise ShapeError(f"input '{name}' shape {format_shape(shape)} is outside the engine's "
                             f"profile (min {format_shape(lo)}, max {format_shape(hi)}); rebuild "
                             f"with --minShapes/--maxShapes that cover it")


def random_feed(inputs: Sequence[TensorSpec], shapes: Mapping[str, Shape] | None = None,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs like trtexec's: ``shapes`` or each input's default (opt) shape."""
    shapes = dict(shapes or {})
    names = {s.name for s in inputs}
    for name in shapes:
        if name not in names:
            raise InputError(f"--shapes: unknown input '{name}'; the engine's inputs are: "
                             f"{', '.join(sorted(names))}")
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in inputs:
        shape = tuple(shapes.get(spec.name, spec.default_shape()))
        check_shape(spec, shape)
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feed[spec.name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feed

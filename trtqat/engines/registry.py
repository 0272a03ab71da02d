"""Backends by name: what each one is and can do, its classes imported on first use.

A backend is one :class:`BackendInfo` registered here (``ort`` needs onnxruntime,
``tensorrt`` TensorRT). Command lines and stages ask it for facts (file kind, whether INT8
needs the CPU Q/DQ re-encoding, the runner options it takes, its help text, the flags it
ignores) instead of testing the backend's name. A new backend is one module with a
:class:`~trtqat.engines.base.Builder` and an :class:`~trtqat.engines.base.Engine` subclass,
plus one :func:`register_backend` call.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trtqat.engines.base import Builder, Engine
from trtqat.engines.errors import BackendUnavailableError, EngineFileError, OptionsError
from trtqat.engines.fileformat import KIND_ONNX, KIND_PLAN, read_engine_files
from trtqat.engines.specs import BuildOptions

# (flag dest, does the note apply?, what to say after "--flag ")
FlagNote = tuple[str, bool, str]


@dataclass(frozen=True)
class BackendInfo:
    """One backend: its classes (imported on first use) and the facts callers branch on.

    Attributes:
        name: the canonical name (``--backend``, engine headers, ``Engine.backend``).
        title: the product name for messages, e.g. 'ONNX Runtime'.
        module, builder, engine: where its Builder and Engine classes live.
        aliases: other accepted spellings of ``name``.
        file_kind: what an engine file holds: ``'onnx'`` (an ONNX model, readable with onnx)
            or ``'plan'`` (an opaque serialized engine).
        package: the Python module it needs; ``install`` says how to get it.
        needs_gpu: it runs only on an NVIDIA GPU (else it can run on the CPU).
        int8_rewrite: INT8 Q/DQ models run integer kernels only after the CPU Q/DQ
            re-encoding (``ort_prepare='qdq'`` with ``calib_feeds``).
        fp16_emulated_on_cpu: on the CPU it runs fp16 models in float (speed and accuracy
            say nothing about a GPU's fp16).
        runner_options: keyword options ``engine.runner()`` accepts.
        own_flags: trtqat-exec flags (argparse dests) only this backend honours.
        flag_notes: ``notes(given flags by dest)`` -> what this backend does with other
            backends' flags; None: each of them is named as ignored.
    """

    name: str
    title: str
    module: str
    builder: str
    engine: str
    aliases: tuple[str, ...] = ()
    file_kind: str = KIND_PLAN
    package: str = ""
    install: str = ""
    needs_gpu: bool = False
    int8_rewrite: bool = False
    fp16_emulated_on_cpu: bool = False
    runner_options: tuple[str, ...] = ("device",)
    own_flags: tuple[str, ...] = ()
    flag_notes: Callable[[Mapping[str, Any]], list[FlagNote]] | None = None

    @property
    def takes_threads(self) -> bool:
        """Its runner takes ``threads`` (intra-op threads)."""
        return "threads" in self.runner_options

    @property
    def onnx_payload(self) -> bool:
        """Its engine files hold an ONNX model (node counts, integer-input bounds readable)."""
        return self.file_kind == KIND_ONNX

    def runner_kwargs(self, **options: Any) -> dict[str, Any]:
        """The subset of ``options`` this backend's runner takes."""
        return {k: v for k, v in options.items() if k in self.runner_options}

    def ignored_flags(self, given: Mapping[str, Any]) -> list[FlagNote]:
        """(flag dest, applies?, note) for the flags this backend ignores or reinterprets."""
        if self.flag_notes is not None:
            return self.flag_notes(given)
        notes = []
        for other in _BACKENDS.values():
            article = "an" if other.title[:1].upper() in "AEIOU" else "a"
            notes += [(dest, True, f"is {article} {other.title} option; the {self.title} "
                       "backend ignores it") for dest in other.own_flags
                      if other is not self and dest not in self.own_flags]
        return notes

    def available(self) -> bool:
        """Its package is installed (nothing is imported)."""
        return not self.package or importlib.util.find_spec(self.package) is not None

    def require(self) -> None:
        """Raise BackendUnavailableError (with the install line) when not :meth:`available`."""
        if not self.available():
            raise BackendUnavailableError(f"backend '{self.name}' is not installed: {self.install}")


_ORT_IGNORES = "is ignored by the ONNX Runtime backend"
_TRT_ONLY = f"{_ORT_IGNORES} (TensorRT only; ORT's TensorRT provider takes it with --providers=tensorrt)"


def _ort_flag_notes(given: Mapping[str, Any]) -> list[FlagNote]:
    """ONNX Runtime and TensorRT's flags: some apply through ORT's GPU providers."""
    providers = (given.get("providers") or "cpu").split(",")
    trt_ep = "tensorrt" in providers
    gpu = trt_ep or "cuda" in providers
    return [
        ("timingCacheFile", not trt_ep, _TRT_ONLY),
        ("memPoolSize", not trt_ep, _TRT_ONLY),
        ("builderOptimizationLevel", not trt_ep, "is a TensorRT builder setting; on ONNX "
         "Runtime it only picks the graph optimization level (0 disabled, 1 basic, "
         "2 extended, 3-5 all)"),
        ("stronglyTyped", True,
         f"{_ORT_IGNORES} (TensorRT only: ONNX Runtime keeps the ONNX types)"),
        ("useSpinWait", True,
         f"{_ORT_IGNORES} (it runs synchronously: there is nothing to wait for)"),
        ("infStreams", (given.get("infStreams") or 1) > 1,
         f"{_ORT_IGNORES} (it runs one query at a time; --threads sets intra-op threads)"),
        ("device", not gpu, f"{_ORT_IGNORES} with the CPU provider (use --providers=cuda)"),
        ("cuda_graph", not gpu and given.get("cuda_graph") is True,
         f"{_ORT_IGNORES} with the CPU provider (CUDA graphs need --providers=cuda or "
         "tensorrt)"),
    ]


_BACKENDS: dict[str, BackendInfo] = {}
_ALIASES: dict[str, str] = {}
DEFAULT_BACKEND = "ort"


def register_backend(info: BackendInfo) -> BackendInfo:
    """Add (or replace) a backend; its name and aliases become valid ``--backend`` values."""
    _BACKENDS[info.name] = info
    for alias in info.aliases:
        _ALIASES[alias] = info.name
    return info


register_backend(BackendInfo(
    name="ort", title="ONNX Runtime", module="trtqat.engines.ort", builder="OrtBuilder",
    engine="OrtEngine", aliases=("onnxruntime",), file_kind=KIND_ONNX, package="onnxruntime",
    install="pip install onnxruntime", int8_rewrite=True, fp16_emulated_on_cpu=True,
    runner_options=("device", "threads"),
    own_flags=("threads", "providers", "ortPrepare", "cpuInt8", "calibInputs"),
    flag_notes=_ort_flag_notes))
register_backend(BackendInfo(
    name="tensorrt", title="TensorRT", module="trtqat.engines.trt", builder="TrtBuilder",
    engine="TrtEngine", aliases=("trt",), file_kind=KIND_PLAN, package="tensorrt",
    install="pip install 'trtqat[tensorrt]' on a machine with an NVIDIA GPU, or use "
    "--backend ort", needs_gpu=True, runner_options=("device", "spin_wait", "streams"),
    own_flags=("timingCacheFile", "memPoolSize", "builderOptimizationLevel", "stronglyTyped",
               "useSpinWait", "infStreams")))


def backend_names() -> list[str]:
    """Registered backend names."""
    return list(_BACKENDS)


def canonical_backend(name: str) -> str:
    """``'trt'`` -> ``'tensorrt'``; unknown names are a user error."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _BACKENDS:
        raise OptionsError(f"unknown backend '{name}'; use one of {', '.join(_BACKENDS)}")
    return key


def backend_info(name: str) -> BackendInfo:
    """The :class:`BackendInfo` of ``name`` (or an alias); unknown names are a user error."""
    return _BACKENDS[canonical_backend(name)]


def default_backend() -> str:
    """The backend used when none is named (building from ONNX)."""
    return DEFAULT_BACKEND


def backends_help(default_text: str = "the default") -> str:
    """``--backend`` help: 'ort (ONNX Runtime, the default) or tensorrt (TensorRT)' (no
    default named where ``default_text`` is empty)."""
    parts = [f"{info.name} ({info.title}"
             f"{', ' + default_text if default_text and name == DEFAULT_BACKEND else ''})"
             for name, info in _BACKENDS.items()]
    return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]


def backend_for_file_kind(kind: str) -> str:
    """The backend that loads an engine file of ``kind`` without a sidecar."""
    return next((n for n, info in _BACKENDS.items() if info.file_kind == kind),
                next(n for n, info in _BACKENDS.items() if info.file_kind == KIND_PLAN))


def file_kind_of(name: str | None) -> str:
    """What an engine file of backend ``name`` holds (a plan for unknown names)."""
    info = _BACKENDS.get(_ALIASES.get(str(name).lower(), str(name).lower()))
    return info.file_kind if info is not None else KIND_PLAN


def _attr(name: str, attr: str) -> Any:
    info = backend_info(name)
    return getattr(importlib.import_module(info.module), getattr(info, attr))


def builder_class(name: str) -> type[Builder]:
    """The Builder class of backend ``name`` (imports the backend module)."""
    return _attr(name, "builder")


def engine_class(name: str) -> type[Engine]:
    """The Engine class of backend ``name`` (imports the backend module)."""
    return _attr(name, "engine")


def build_engine(onnx_path: str | os.PathLike[str], backend: str | None = None,
                 options: BuildOptions | None = None, *, out: str | os.PathLike[str] | None = None,
                 **option_kwargs: Any) -> Engine:
    """Build an engine from an ONNX file, as ``trtqat build`` does; ``out``: save it there
    (the backend's file and its ``.json`` sidecar, each atomically; ``engine.path``).

    ``backend``: ``"ort"`` (ONNX Runtime, the default) or ``"tensorrt"``. Build options are
    :class:`~trtqat.engines.specs.BuildOptions` fields, given as ``options`` or as keywords
    (which change ``options``); shapes are dicts or trtexec strings::

        engine = trtqat.build_engine("m.onnx", shapes={"input": (8, 3, 224, 224)},
                                     out="m.engine")
        engine = trtqat.build_engine("m.onnx", "tensorrt", shapes="input:8x3x224x224")

    Raises the :mod:`trtqat.engines.errors` the command line reports, and
    :class:`~trtqat.out_paths.OutputPathError` for an ``out`` that is the input ONNX file or
    an existing file that is not an earlier engine (trtqat replaces only its own files).
    """
    import dataclasses

    from trtqat.checks import check_keys
    from trtqat.engines.errors import OptionsError
    from trtqat.engines.specs import BuildOptions, parse_shapes

    check_keys("BuildOptions", option_kwargs, [f.name for f in dataclasses.fields(BuildOptions)],
               OptionsError)

    if out is not None:  # before the build: nothing is spent on a refused path
        from trtqat.engines.out_check import check_engine_output

        check_engine_output(out, "out", [("onnx_path", onnx_path)], choose="out path")

    for key in ("shapes", "min_shapes", "opt_shapes", "max_shapes"):
        if isinstance(option_kwargs.get(key), str):
            option_kwargs[key] = parse_shapes(option_kwargs[key], key)
    engine = builder_class(backend or default_backend())(options, **option_kwargs).build(
        onnx_path)
    from trtqat.engines.ort_nodes import mostly_float_note
    from trtqat.engines.qformats import log_format_notes

    note = mostly_float_note(engine.header)
    if note:
        logging.getLogger("trtqat.build").warning(note)
    log_format_notes(engine.header, logging.getLogger("trtqat.build"))
    if out is not None:
        engine.save(out)
    return engine


def load_engine(path: str | os.PathLike[str], backend: str | None = None) -> Engine:
    """Load an engine file; ``backend=None`` takes it from the sidecar, else the content.

    A plain ONNX model loads as an ONNX Runtime engine; any other file is taken for a
    TensorRT plan (which needs TensorRT to check and run).
    """
    found = read_engine_files(path)
    if backend is None:
        if found.header is not None:
            backend = str(found.header.get("backend"))
            if backend not in _BACKENDS:
                raise EngineFileError(f"{path} names an unknown backend '{backend}'; rebuild it")
        else:
            backend = backend_for_file_kind(found.kind)
    return engine_class(backend).from_file(found)

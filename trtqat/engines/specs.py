"""Tensor specs, shape strings and build options shared by every backend."""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trtqat.checks import check_config_types
from trtqat.engines.errors import OptionsError, ShapeError

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
# A model's declared shape: None marks a dynamic dimension (ONNX dim_param, TensorRT -1).
DeclaredShape = tuple[int | None, ...]

MEMORY_POOLS = ("workspace", "tacticSharedMem")
PROFILING_VERBOSITY = ("layer_names_only", "detailed", "none")  # trtexec --profilingVerbosity
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
             "tensorrt": "TensorrtExecutionProvider"}


def format_shape(shape: Sequence[int | None]) -> str:
    """``(1, 3, None)`` -> ``'1x3x?'`` (trtexec's spelling)."""
    return "x".join("?" if d is None or d < 0 else str(d) for d in shape) or "scalar"


def total_memory() -> int:
    """Bytes of physical memory of this machine (a large number if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def check_shape_memory(name: str, shape: Shape, flag: str, itemsize: int = 4) -> None:
    """Refuse a shape whose tensor (``itemsize`` bytes per element, float32 by default)
    would not fit in this machine's memory, before anything is allocated."""
    nbytes = math.prod(shape) * itemsize
    limit = total_memory()
    if nbytes > limit:
        raise ShapeError(f"{flag}: input '{name}' {format_shape(shape)} needs "
                         f"{nbytes / 2**30:.3g} GiB at {itemsize} bytes per element, more than "
                         f"this machine's {limit / 2**30:.3g} GiB of memory; use a smaller "
                         "batch or image size")


def check_shape(name: Any, shape: Any, flag: str = "--shapes") -> Shape:
    """``shape`` as a tuple of ints, each >= 1 and the tensor within this machine's memory;
    anything else is one :class:`ShapeError` line (the CLI's and the API's shapes alike)."""
    example = f"{flag}={name}:1x3x224x224 (API: {{{name!r}: (1, 3, 224, 224)}})"
    if not isinstance(name, str) or not name:
        raise ShapeError(f"{flag}: input names are strings, got {name!r}; write e.g. {example}")
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ShapeError(f"{flag}: shape of '{name}' must be a sequence of integers, got "
                         f"{shape!r}; write e.g. {example}")
    dims = tuple(shape)
    if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
        raise ShapeError(f"{flag}: shape {dims!r} of '{name}' must hold integers only; write "
                         f"e.g. {example}")
    if any(d < 1 for d in dims):
        kind = "a negative" if min(dims) < 0 else "a zero"
        given = "x".join(map(str, dims))
        raise ShapeError(f"{flag}: {kind} dimension in '{name}:{given}'; every dimension must "
                         f"be >= 1, e.g. {example}")
    dims = tuple(int(d) for d in dims)
    check_shape_memory(name, dims, flag)
    return dims


def check_shapes(shapes: Any, flag: str = "--shapes") -> dict[str, Shape]:
    """A ``{name: shape}`` mapping checked by :func:`check_shape` (None: {})."""
    if shapes is None:
        return {}
    if not isinstance(shapes, Mapping):
        raise ShapeError(f"{flag} must be a dict {{input name: shape}} or a string like "
                         f"'input:1x3x224x224', got {type(shapes).__name__}")
    return {name: check_shape(name, shape, flag) for name, shape in shapes.items()}


def parse_shapes(text: str, flag: str = "--shapes") -> dict[str, Shape]:
    """Parse trtexec's ``name:1x3x224x224,name2:4x10`` into ``{name: shape}``."""
    shapes: dict[str, Shape] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, dims = item.rpartition(":")
        name = name.strip("'\"")
        if not sep or not name:
            raise ShapeError(f"{flag}: '{item}' is not name:DIMS; write e.g. "
                             f"{flag}=input:1x3x224x224")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            raise ShapeError(f"{flag}: '{dims}' for input '{name}' is not like "
                             "1x3x224x224") from None
        check_shape(name, shape, flag)
        if name in shapes:
            raise ShapeError(f"{flag}: input '{name}' is given twice; give each input once")
        shapes[name] = shape
    if not shapes:
        raise ShapeError(f"{flag}: no shapes given; write e.g. {flag}=input:1x3x224x224")
    return shapes


@dataclass(frozen=True)
class TensorSpec:
    """One engine input or output: name, numpy dtype name, declared shape and profile."""

    name: str
    dtype: str
    shape: DeclaredShape
    min_shape: Shape | None = None
    opt_shape: Shape | None = None
    max_shape: Shape | None = None

    @property
    def is_dynamic(self) -> bool:
        return any(d is None for d in self.shape)

    @property
    def has_profile(self) -> bool:
        return self.min_shape is not None

    def default_shape(self) -> Shape:
        """The shape to feed when the user gave none: the profile's opt, else dynamic dims 1."""
        if self.opt_shape is not None:
            return self.opt_shape
        return tuple(1 if d is None else d for d in self.shape)

    def describe(self) -> str:
        text = f"{self.name} ({self.dtype} {format_shape(self.shape)}"
        if self.has_profile and self.min_shape != self.max_shape:
            lo, hi = format_shape(self.min_shape or ()), format_shape(self.max_shape or ())
            text += f", profile {lo}..{hi}"
        return text + ")"

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorSpec:
        def tup(v: Any) -> Any:
            return None if v is None else tuple(v)
        return cls(name=str(data["name"]), dtype=str(data["dtype"]), shape=tuple(data["shape"]),
                   min_shape=tup(data.get("min_shape")), opt_shape=tup(data.get("opt_shape")),
                   max_shape=tup(data.get("max_shape")))


def _check_dims(name: str, declared: DeclaredShape, shape: Shape, what: str) -> None:
    if len(shape) != len(declared):
        raise ShapeError(f"{what} {format_shape(shape)} for input '{name}' has rank {len(shape)}, "
                         f"the model's input is {format_shape(declared)} (rank {len(declared)})")
    for axis, (want, got) in enumerate(zip(declared, shape)):
        if want is not None and want != got:
            fix = ("re-export the ONNX with a dynamic batch axis, or use batch "
                   f"{want}" if axis == 0 else f"use {want} there")
            dim = "the batch dimension (0)" if axis == 0 else f"dimension {axis}"
            raise ShapeError(f"{what} {format_shape(shape)} for input '{name}': {dim} is fixed to "
                             f"{want} in the model, not {got}; {fix}")


def resolve_profile(inputs: Sequence[TensorSpec], options: BuildOptions, *,
                    dynamic_default_one: bool) -> tuple[TensorSpec, ...]:
    """Attach min/opt/max shapes from ``options`` to the model's inputs, checking them.

    ``shapes`` sets all three; a missing one of the three copies opt (opt itself defaults
    to max, then min). Dynamic inputs without shapes get dims 1 when
    ``dynamic_default_one`` (what trtexec does for TensorRT); otherwise they stay
    unconstrained (ONNX Runtime accepts any size there).
    """
    names = {spec.name for spec in inputs}
    for flag, given in (("--shapes", options.shapes), ("--minShapes", options.min_shapes),
                        ("--optShapes", options.opt_shapes), ("--maxShapes", options.max_shapes)):
        for name in given:
            if name not in names:
                raise ShapeError(f"{flag}: unknown input '{name}'; the model's inputs are: "
                                 f"{', '.join(sorted(names))}")
    min_shapes, opt_shapes, max_shapes = options.profile_shapes()
    out = []
    for spec in inputs:
        opt = opt_shapes.get(spec.name) or max_shapes.get(spec.name) or min_shapes.get(spec.name)
        if opt is None:
            if spec.is_dynamic and dynamic_default_one:
                opt = spec.default_shape()
                log.warning("dynamic input '%s' %s has no shapes: using %s (pass --shapes or "
                            "--minShapes/--optShapes/--maxShapes)", spec.name,
                            format_shape(spec.shape), format_shape(opt))
            elif not spec.is_dynamic:
                opt = tuple(int(d) for d in spec.shape if d is not None)
            else:
                out.append(spec)
                continue
        lo, hi = min_shapes.get(spec.name, opt), max_shapes.get(spec.name, opt)
        labels = (("--shapes",) * 3 if options.profiled_by_shapes(spec.name)
                  else ("min shape", "opt shape", "max shape"))
        for what, shape in zip(labels, (lo, opt, hi)):
            _check_dims(spec.name, spec.shape, shape, what)
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise ShapeError(f"input '{spec.name}': need min <= opt <= max in every dimension, got "
                             f"{format_shape(lo)}, {format_shape(opt)}, {format_shape(hi)}")
        out.append(replace(spec, min_shape=tuple(lo), opt_shape=tuple(opt), max_shape=tuple(hi)))
    return tuple(out)


@dataclass(frozen=True)
class BuildOptions:
    """How to build an engine; every field is checked on construction.

    ``shapes`` sets min = opt = max (trtexec's --shapes when building) for inputs that
    min/opt/max do not name; with them it is only the run shape. Precision flags
    (``fp16``, ``int8``, ``fp8``, ``int4``, ``best``) only exist in TensorRT 10; elsewhere
    precision comes from the ONNX (``trtqat export --variant fp16|int8|int8-fp16|fp8|...``).
    TensorRT 10 also sets FP8/INT4 itself for a file that holds FP8 Q/DQ or INT4 weights.
    """

    shapes: Mapping[str, Shape] = field(default_factory=dict)
    min_shapes: Mapping[str, Shape] = field(default_factory=dict)
    opt_shapes: Mapping[str, Shape] = field(default_factory=dict)
    max_shapes: Mapping[str, Shape] = field(default_factory=dict)
    fp16: bool = False
    int8: bool = False
    fp8: bool = False
    int4: bool = False
    best: bool = False
    memory_pools: Mapping[str, int] = field(default_factory=dict)
    builder_optimization_level: int | None = None
    timing_cache: str | None = None
    strongly_typed: bool = False
    threads: int | None = None
    providers: tuple[str, ...] = ("cpu",)
    cuda_graph: bool = False
    # "auto": re-encode TensorRT-style Q/DQ graphs for ORT's integer CPU kernels when the
    # CPU provider alone runs them; "qdq" always; None or "none" never.
    ort_prepare: str | None = "auto"
    verbose: bool = False
    profiling_verbosity: str = "layer_names_only"
    # Inputs (name -> array dicts) that calibrate what a prepare step adds and check the
    # built engine agrees with the ONNX (classifiers: top-1 agreement >= min_top1 on the
    # decisive samples and mean centered cosine >= min_cosine; embeddings: mean cosine >=
    # min_cosine); without them the check runs on synthetic inputs. Not stored in the file.
    calib_feeds: tuple[Mapping[str, Any], ...] | None = field(default=None, compare=False,
                                                              repr=False)
    min_top1: float = 0.99
    min_cosine: float = 0.98
    # ORT CPU: store int8 weights as uint8 where the u8 x s8 kernels could saturate (x86
    # without VNNI, see trtqat.engines.ort_u8s8); False runs them as ORT's own PTQ does.
    u8s8_guard: bool = True

    def __post_init__(self) -> None:
        check_config_types(self, "BuildOptions", error=OptionsError)  # bools only bool, ...
        for flag, given in (("--shapes", self.shapes), ("--minShapes", self.min_shapes),
                            ("--optShapes", self.opt_shapes), ("--maxShapes", self.max_shapes)):
            try:
                check_shapes(given, flag)
            except ShapeError as exc:
                raise OptionsError(str(exc)) from None
        if self.profiling_verbosity not in PROFILING_VERBOSITY:
            raise OptionsError(f"--profilingVerbosity must be one of "
                               f"{', '.join(PROFILING_VERBOSITY)}, got {self.profiling_verbosity!r}")
        for pool, size in self.memory_pools.items():
            if pool not in MEMORY_POOLS:
                raise OptionsError(f"--memPoolSize: unknown pool '{pool}'; use one of "
                                   f"{', '.join(MEMORY_POOLS)}")
            if not isinstance(size, int) or size <= 0:
                raise OptionsError(f"--memPoolSize: size of '{pool}' must be > 0 bytes")
        level = self.builder_optimization_level
        if level is not None and not (isinstance(level, int) and 0 <= level <= 5):
            raise OptionsError(f"--builderOptimizationLevel must be 0..5, got {level!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 0):
            raise OptionsError(f"--threads must be an int >= 0, got {self.threads!r}")
        if not 0.0 <= self.min_top1 <= 1.0:
            raise OptionsError(f"min_top1 must be a fraction in [0, 1], got {self.min_top1}")
        if not -1.0 <= self.min_cosine <= 1.0:
            raise OptionsError(f"min_cosine must be in [-1, 1], got {self.min_cosine}")
        if self.calib_feeds is not None:
            feeds = tuple(self.calib_feeds)
            if not all(isinstance(f, Mapping) for f in feeds):
                raise OptionsError("calib_feeds must be a sequence of {input name: array} dicts")
            object.__setattr__(self, "calib_feeds", feeds)
        unknown = [p for p in self.providers if p not in PROVIDERS]
        if unknown or not self.providers:
            raise OptionsError(f"unknown ONNX Runtime provider {unknown[0] if unknown else ''!r}; "
                               f"use {', '.join(PROVIDERS)}")

    def profiled_by_shapes(self, name: str) -> bool:
        """True when ``--shapes`` sets the profile of ``name`` (it is in no min/opt/max)."""
        return name in self.shapes and not any(
            name in given for given in (self.min_shapes, self.opt_shapes, self.max_shapes))

    def profile_shapes(self) -> tuple[dict[str, Shape], dict[str, Shape], dict[str, Shape]]:
        """(min, opt, max) with ``shapes`` merged in where min/opt/max do not name the input
        (trtexec: with --minShapes/--optShapes/--maxShapes, --shapes is the run shape only)."""
        lo, opt, hi = dict(self.min_shapes), dict(self.opt_shapes), dict(self.max_shapes)
        for name, shape in self.shapes.items():
            if self.profiled_by_shapes(name):
                lo[name] = opt[name] = hi[name] = tuple(shape)
        return lo, opt, hi

    def with_changes(self, **changes: Any) -> BuildOptions:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe copy, stored in the engine file's header."""
        feeds = self.calib_feeds
        data = asdict(replace(self, calib_feeds=None))
        data["calib_feeds"] = len(feeds) if feeds else 0
        for key in ("shapes", "min_shapes", "opt_shapes", "max_shapes"):
            data[key] = {k: list(v) for k, v in data[key].items()}
        data["memory_pools"] = dict(data["memory_pools"])
        data["providers"] = list(self.providers)
        return data


def export_variant_hint(options: BuildOptions) -> str | None:
    """The ``trtqat export --variant`` that gives the precision the flags ask for."""
    for fmt in ("fp8", "int4"):
        if getattr(options, fmt):
            return f"{fmt}-fp16" if options.fp16 or options.best else fmt
    if options.best or (options.int8 and options.fp16):
        return "int8-fp16"
    if options.int8:
        return "int8"
    if options.fp16:
        return "fp16"
    return None


# BuildOptions fields that are builder precision flags (TensorRT 10's --fp16/--int8/--fp8/
# --int4/--best)
PRECISION_FLAGS = ("fp16", "int8", "fp8", "int4", "best")


def precision_note(options: BuildOptions, backend: str) -> str | None:
    """What to tell a user whose precision flags the backend cannot set (None: no flags)."""
    variant = export_variant_hint(options)
    if variant is None:
        return None
    flags = " ".join(f"--{f}" for f in PRECISION_FLAGS if getattr(options, f))
    return (f"{flags}: {backend} takes precision from the ONNX graph, not from builder flags; "
            f"export the model with 'trtqat export --variant {variant}'")

"""Trace one module's own ``forward`` with torch.fx, every child module a leaf.

A module is traced for one *call pattern*: which arguments are tensors, which are lists of
tensors and which hold a constant (``mask=None``, ``need_weights=False``). The pattern
comes from the call site in the parent's graph when there is one, else from the signature
(arguments without a default are tensors, the others keep their default). The traced graph
is only valid for calls that match the pattern; :mod:`trtqat.quant.placement.codegen`
generates a forward that checks it and falls back to the original forward otherwise.

Modules whose forward depends on ``self.training`` are traced in both modes.
"""

from __future__ import annotations

import inspect
import keyword
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

_SIMPLE = (type(None), bool, int, float, str)
# torch.nn classes whose forward holds no op a placement rule looks at (leaves, untraced)
_CONTAINERS = (nn.Sequential,)


def simple_constant(value: Any) -> bool:
    """A constant a traced graph may be specialised on (None, bools, numbers, strings)."""
    if isinstance(value, (tuple, list)):
        return all(simple_constant(v) for v in value)
    return isinstance(value, _SIMPLE)


@dataclass(frozen=True)
class Arg:
    """How one parameter of ``forward`` is called: ``tensor``, ``seq`` (a list or tuple of
    ``size`` tensors), ``const`` (``value``), ``varargs`` / ``varkw`` (called empty)."""

    name: str
    kind: str
    size: int = 0
    seq: type = list
    value: Any = None


@dataclass
class Pattern:
    """The call pattern a graph was traced for, one :class:`Arg` per parameter."""

    params: tuple[inspect.Parameter, ...]
    args: tuple[Arg, ...]

    def flat_names(self) -> list[str]:
        """The traced function's parameters (after ``self``): tensors, then seq items."""
        names: list[str] = []
        for a in self.args:
            if a.kind == "tensor":
                names.append(a.name)
            elif a.kind == "seq":
                names += [f"{a.name}_{i}" for i in range(a.size)]
        return names

    def slots(self) -> dict[str, tuple[str, int | None]]:
        """flat name -> (parameter, index in its sequence or None)."""
        out: dict[str, tuple[str, int | None]] = {}
        for a in self.args:
            if a.kind == "tensor":
                out[a.name] = (a.name, None)
            elif a.kind == "seq":
                out.update({f"{a.name}_{i}": (a.name, i) for i in range(a.size)})
        return out


@dataclass
class ModuleTrace:
    """One module's traced forward: the eval graph (the one analysed), the train graph when
    training mode traces differently, and the pattern both were traced for."""

    path: str
    module: nn.Module
    base: type
    pattern: Pattern
    graph: fx.Graph
    train_graph: fx.Graph | None = None
    calls: dict[str, int] = field(default_factory=dict)  # child path -> call nodes

    def node_module(self, node: fx.Node) -> nn.Module | None:
        """The child a ``call_module`` node calls."""
        if node.op != "call_module":
            return None
        try:
            return self.module.get_submodule(str(node.target))
        except AttributeError:
            return None


class _LeafTracer(fx.Tracer):
    """Every module below the traced one is a leaf; parameter shapes are constants."""

    def __init__(self) -> None:
        super().__init__(param_shapes_constant=True)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _PartsProxy(node, self)

    def iter(self, obj: fx.Proxy):
        """Iterating over ``x.chunk(n)`` or ``x.split([a, b])`` (``list(...)``, ``for``)
        yields its ``n`` parts; FX itself only unpacks ``a, b = ...``."""
        count = _parts(obj.node)
        if count is None:
            return super().iter(obj)
        return iter([obj[i] for i in range(count)])


class _PartsProxy(fx.Proxy):
    """A proxy whose ``len()`` is known for chunk/split results (``list(x.chunk(2))``)."""

    def __len__(self) -> int:
        count = _parts(self.node)
        if count is None:
            return super().__len__()
        return count


def _parts(node: fx.Node) -> int | None:
    """How many tensors a chunk/split node returns, when its arguments say."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op not in ("call_method", "call_function") or name not in ("chunk", "split"):
        return None
    arg = node.args[1] if len(node.args) > 1 else node.kwargs.get(
        "chunks" if name == "chunk" else "split_size_or_sections")
    if name == "chunk" and isinstance(arg, int):
        return arg
    if name == "split" and isinstance(arg, (list, tuple)):
        return len(arg)
    return None


def base_class(module: nn.Module) -> type:
    """The user's class of ``module`` (the class a placement subclass was made from)."""
    return getattr(type(module), "_trtqat_base", type(module))


def traceable_kind(module: nn.Module) -> str | None:
    """Why ``module`` is not traced (a leaf: torch.nn layers, trtqat's own modules), or None."""
    cls = base_class(module)
    mod = cls.__module__ or ""
    if isinstance(module, torch.jit.ScriptModule):
        return "a TorchScript module"
    if "forward" in vars(module):
        return "its forward is set on the instance"
    if mod.startswith("torch.") and not isinstance(module, _CONTAINERS):
        return "leaf"
    if mod.startswith("trtqat.") and not mod.startswith(("trtqat.quant.placement",
                                                        "trtqat.families.")):
        return "leaf"
    if mod.startswith("transformers."):
        return "leaf"  # Hugging Face attention: quantized by trtqat.quant.plugins.attention
    from trtqat.quant.placement.ops import is_opaque_layer

    if is_opaque_layer(module):
        return "leaf"
    if type(module).__call__ is not nn.Module.__call__:
        return "it overrides __call__"
    return None


def default_pattern(cls: type) -> Pattern:
    """Parameters without a default are tensors, the others keep their (simple) default."""
    params = _params(cls)
    args = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            args.append(Arg(p.name, "varargs"))
        elif p.kind is p.VAR_KEYWORD:
            args.append(Arg(p.name, "varkw"))
        elif p.default is p.empty or not simple_constant(p.default):
            args.append(Arg(p.name, "tensor"))
        else:
            args.append(Arg(p.name, "const", value=p.default))
    return Pattern(tuple(params), tuple(args))


def call_pattern(cls: type, args: tuple, kwargs: dict) -> Pattern | None:
    """The pattern of one call site (``args``/``kwargs`` of a ``call_module`` node), or None
    when the call does not bind to the signature or passes something else."""
    params = _params(cls)
    try:
        bound = inspect.Signature(list(params)).bind(*args, **kwargs)
    except TypeError:
        return None
    out = []
    for p in params:
        given = p.name in bound.arguments
        value = bound.arguments.get(p.name)
        if p.kind is p.VAR_POSITIONAL:
            if value:
                return None
            out.append(Arg(p.name, "varargs"))
        elif p.kind is p.VAR_KEYWORD:
            if value:
                return None
            out.append(Arg(p.name, "varkw"))
        elif not given:
            if p.default is p.empty or not simple_constant(p.default):
                return None
            out.append(Arg(p.name, "const", value=p.default))
        elif isinstance(value, fx.Node):
            out.append(Arg(p.name, "tensor"))
        elif isinstance(value, (list, tuple)) and value and all(
                isinstance(v, fx.Node) for v in value):
            out.append(Arg(p.name, "seq", size=len(value),
                           seq=list if isinstance(value, list) else tuple))
        elif simple_constant(value):
            out.append(Arg(p.name, "const", value=value))
        else:
            return None
    return Pattern(tuple(params), tuple(out))


def _params(cls: type) -> list[inspect.Parameter]:
    sig = inspect.signature(cls.forward)
    params = list(sig.parameters.values())[1:]  # self
    for p in params:
        if keyword.iskeyword(p.name) or not p.name.isidentifier():
            raise TypeError(f"parameter {p.name!r}")
    return params


def call_args_source(pattern: Pattern, value_of) -> str:
    """The argument list of a call of the original forward, each value from ``value_of(arg)``
    (a source expression)."""
    parts = []
    for p, a in zip(pattern.params, pattern.args):
        if a.kind in ("varargs", "varkw"):
            continue
        expr = value_of(a)
        parts.append(expr if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                     else f"{p.name}={expr}")
    return ", ".join(parts)


def _trace_root_class(base: type, pattern: Pattern) -> type:
    """A subclass of ``base`` whose forward takes the pattern's flat tensors and calls the
    original forward with the constants and lists filled in."""

    def value_of(a: Arg) -> str:
        if a.kind == "tensor":
            return a.name
        if a.kind == "seq":
            items = ", ".join(f"{a.name}_{i}" for i in range(a.size))
            return f"[{items}]" if a.seq is list else f"({items},)"
        return f"_C[{a.name!r}]"

    flat = pattern.flat_names()
    src = (f"def forward(self{''.join(', ' + n for n in flat)}):\n"
           f"    return _BASE_FORWARD(self, {call_args_source(pattern, value_of)})\n")
    scope = {"_BASE_FORWARD": base.forward,
             "_C": {a.name: a.value for a in pattern.args if a.kind == "const"}}
    exec(compile(src, f"<trtqat trace root of {base.__name__}>", "exec"), scope)
    return type(f"_TraceRoot{base.__name__}", (base,), {"forward": scope["forward"],
                                                          "__module__": __name__})


def _trace_once(module: nn.Module, root_cls: type, training: bool) -> fx.Graph:
    """Trace ``module``'s forward; whatever the forward stores on the modules while traced
    (a cached shape, anchors: proxies) is undone, as are the mode and class."""
    state = {m: (m.__dict__.copy(), dict(m._buffers)) for m in module.modules()}
    saved = module.__class__
    constants: dict[str, torch.Tensor] = {}
    try:
        module.train(training)
        module.__class__ = root_cls
        graph = _LeafTracer().trace(module)
        # tensors the forward makes (torch.tensor(...), an index table): fx stores them on
        # the traced module as `_tensor_constantN`, which the placed forward reads
        constants = {str(n.target): getattr(module, str(n.target)) for n in graph.nodes
                     if n.op == "get_attr" and str(n.target).startswith("_tensor_constant")}
        return graph
    finally:
        module.__class__ = saved
        for m, (attrs, buffers) in state.items():
            m.__dict__.clear()
            m.__dict__.update(attrs)
            m._buffers.clear()
            m._buffers.update(buffers)
        for name, value in constants.items():  # kept (moved by .to(), not in state_dict)
            if isinstance(value, torch.Tensor) and name not in module._buffers:
                module.register_buffer(name, value, persistent=False)


def trace_module(path: str, module: nn.Module, pattern: Pattern) -> ModuleTrace:
    """Trace ``module`` for ``pattern`` in eval and train mode (raises what tracing raises)."""
    base = base_class(module)
    traced_fn = getattr(type(module), "_trtqat_eval", None)
    root_cls = _trace_root_class(base, pattern)
    if traced_fn is not None and getattr(type(module), "_trtqat_pattern", None) == pattern:
        # an already placed module: analyse its placed graph (idempotent placement)
        flat = pattern.flat_names()
        src = f"def forward(self{''.join(', ' + n for n in flat)}):\n    return _F(self{''.join(', ' + n for n in flat)})\n"
        scope: dict[str, Any] = {"_F": traced_fn}
        exec(compile(src, "<trtqat placed root>", "exec"), scope)
        root_cls = type("_PlacedRoot", (base,), {"forward": scope["forward"],
                                                 "__module__": __name__})
    graph = _trace_once(module, root_cls, training=False)
    train = _trace_once(module, root_cls, training=True)
    train_graph = None if _same_code(graph, train) else train
    result = ModuleTrace(path, module, base, pattern, graph, train_graph)
    for node in graph.nodes:
        if node.op == "call_module":
            result.calls[str(node.target)] = result.calls.get(str(node.target), 0) + 1
    return result


def _same_code(a: fx.Graph, b: fx.Graph) -> bool:
    return a.python_code("self").src == b.python_code("self").src

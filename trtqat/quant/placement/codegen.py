"""Placed classes: a module's class with a forward generated from its rewritten graph.

``placed_class(base, pattern, eval_src, train_src)`` returns a subclass of ``base``
(``QuantBasicBlock`` for a ``BasicBlock``) whose forward checks the call against the
pattern the graph was traced for and runs the rewritten graph, or the original forward
for any other call. The class is rebuilt from its sources when a model is unpickled or
deep-copied (``__reduce_ex__``), so placed models pickle like any other (Ultralytics saves
whole pickled models).
"""

from __future__ import annotations

import builtins
import importlib
import linecache
import types
from typing import Any

import torch
from torch import fx

from trtqat.quant.placement.trace import Arg, Pattern

_CACHE: dict[tuple, type] = {}


def graph_source(graph: fx.Graph, name: str) -> tuple[str, dict[str, Any]]:
    """Python source of ``graph`` as a function ``name(self, ...)`` and the globals it needs
    (as import references, see :func:`_reference`)."""
    code = graph.python_code(root_module="self")
    src = code.src.replace("def forward(", f"def {name}(", 1)
    refs = {k: _reference(v) for k, v in code.globals.items() if k not in ("inf", "nan")}
    return src, refs


def _reference(value: Any) -> tuple:
    """How a global of generated code is found again: ("module", name), ("attr", module,
    qualname) or ("value", value) for builtins and constants."""
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if mod and qual and "<" not in qual:
        try:
            if _resolve(("attr", mod, qual)) is value:
                return ("attr", mod, qual)
        except (ImportError, AttributeError):
            pass
    if getattr(builtins, getattr(value, "__name__", ""), None) is value:
        return ("attr", "builtins", value.__name__)
    return ("value", value)


def _resolve(ref: tuple) -> Any:
    if ref[0] == "module":
        return importlib.import_module(ref[1])
    if ref[0] == "attr":
        obj: Any = importlib.import_module(ref[1])
        for part in ref[2].split("."):
            obj = getattr(obj, part)
        return obj
    return ref[1]


def _same(value: Any, want: Any) -> bool:
    """``value`` is the constant ``want`` (never compares tensors)."""
    if value is want:
        return True
    if isinstance(value, (tuple, list)) and isinstance(want, (tuple, list)):
        return len(value) == len(want) and all(_same(a, b) for a, b in zip(value, want))
    return type(value) is type(want) and not isinstance(value, torch.Tensor) and value == want


_TENSORS = (torch.Tensor, fx.Proxy)  # a whole-model FX trace runs the placed graph too


def _is_seq(value: Any, size: int) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == size
            and all(isinstance(v, _TENSORS) for v in value))


def _signature_source(pattern: Pattern) -> str:
    parts, star = [], False
    for i, p in enumerate(pattern.params):
        default = f"=_D[{p.name!r}]" if p.default is not p.empty else ""
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                parts.append("*")
                star = True
            parts.append(f"{p.name}{default}")
        else:
            parts.append(f"{p.name}{default}")
            nxt = pattern.params[i + 1] if i + 1 < len(pattern.params) else None
            if p.kind is p.POSITIONAL_ONLY and (nxt is None or nxt.kind is not p.POSITIONAL_ONLY):
                parts.append("/")
    return ", ".join(["self", *parts])


def _condition(a: Arg) -> str:
    if a.kind == "tensor":
        return f"isinstance({a.name}, _Tensor)"
    if a.kind == "seq":
        return f"_is_seq({a.name}, {a.size})"
    if a.kind == "const":
        return f"_same({a.name}, _C[{a.name!r}])"
    return f"not {a.name}"


def _flat_source(pattern: Pattern) -> str:
    parts = []
    for a in pattern.args:
        if a.kind == "tensor":
            parts.append(a.name)
        elif a.kind == "seq":
            parts += [f"{a.name}[{i}]" for i in range(a.size)]
    return "".join(", " + p for p in parts)


def dispatch_source(pattern: Pattern, has_train: bool) -> str:
    """The generated forward: the rewritten graph for calls matching ``pattern``."""
    cond = " and ".join(_condition(a) for a in pattern.args) or "True"
    flat = _flat_source(pattern)
    passthrough = []
    for p in pattern.params:
        if p.kind is p.VAR_POSITIONAL:
            passthrough.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            passthrough.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            passthrough.append(f"{p.name}={p.name}")
        else:
            passthrough.append(p.name)
    lines = [f"def forward({_signature_source(pattern)}):",
             f"    if {cond}:"]
    if has_train:
        lines.append(f"        if self.training:\n            return _placed_train(self{flat})")
    lines += [f"        return _placed_eval(self{flat})",
              f"    return _BASE_FORWARD(self, {', '.join(passthrough)})", ""]
    return "\n".join(lines)


def _exec(src: str, scope: dict[str, Any], filename: str) -> None:
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), scope)


def placed_class(base: type, pattern: Pattern, eval_src: tuple[str, dict],
                 train_src: tuple[str, dict] | None) -> type:
    """The placed subclass of ``base`` (cached: equal sources give the same class)."""
    key = (base, _key(pattern), eval_src[0], train_src[0] if train_src else None)
    if key in _CACHE:
        return _CACHE[key]
    index = len(_CACHE)
    filename = f"<trtqat placed {base.__name__} #{index}>"
    scope: dict[str, Any] = {name: _resolve(ref) for name, ref in eval_src[1].items()}
    if train_src:
        scope.update({name: _resolve(ref) for name, ref in train_src[1].items()})
    scope.update(_Tensor=_TENSORS, _same=_same, _is_seq=_is_seq,
                 _BASE_FORWARD=base.forward,
                 _D={p.name: p.default for p in pattern.params if p.default is not p.empty},
                 _C={a.name: a.value for a in pattern.args if a.kind == "const"})
    src = eval_src[0] + "\n" + (train_src[0] if train_src else "") + "\n" + \
        dispatch_source(pattern, train_src is not None)
    _exec(src, scope, filename)
    spec = (pattern, eval_src, train_src)
    cls = type(f"Quant{base.__name__}", (base,), {
        "forward": scope["forward"], "_trtqat_base": base, "_trtqat_pattern": pattern,
        "_trtqat_eval": scope["_placed_eval"], "_trtqat_spec": spec,
        "__reduce_ex__": _reduce_ex, "__module__": base.__module__,
        "__doc__": f"{base.__name__} with the Q/DQ placement of trtqat (generated)."})
    cls.__qualname__ = f"Quant{base.__qualname__}"
    _CACHE[key] = cls
    return cls


def _key(pattern: Pattern) -> tuple:
    return tuple((a.name, a.kind, a.size, a.seq, repr(a.value)) for a in pattern.args)


def _reduce_ex(self, protocol):
    state = self.__dict__.copy()
    return (rebuild_placed, (type(self)._trtqat_base, type(self)._trtqat_spec), state)


def rebuild_placed(base: type, spec: tuple) -> Any:
    """An empty instance of the placed class of ``base`` (unpickling, deep copies)."""
    cls = placed_class(base, *spec)
    return cls.__new__(cls)


def source_of(module: Any) -> str | None:
    """The generated source of a placed module's forward (for ``describe``), or None."""
    spec = getattr(type(module), "_trtqat_spec", None)
    return None if spec is None else spec[1][0]

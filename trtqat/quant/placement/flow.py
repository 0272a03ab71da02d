"""The whole model's dataflow, from one traced graph per module linked at the call sites.

Each module is traced on its own (children as leaves, :mod:`.trace`), so one module that
FX cannot trace costs only its own placement. A child called from exactly one place of a
traced parent, with a call that matches the pattern it was traced for, is *linked*: its
placeholders are the parent's arguments and its output is the parent's call. Walking
producers and consumers through links sees the model as one graph wherever it was traced.
"""

from __future__ import annotations

import inspect
import logging
import operator
from collections import defaultdict
from collections.abc import Callable

from torch import fx, nn

from trtqat.quant.placement.trace import (
    ModuleTrace,
    Pattern,
    call_pattern,
    default_pattern,
    trace_module,
    traceable_kind,
)

log = logging.getLogger(__name__)
_HOLDERS = (nn.ModuleList, nn.ModuleDict)  # containers with no forward of their own

Ref = tuple[str, fx.Node]  # (path of a traced module, node of its eval graph)


class ModelFlow:
    """Traces of every module of ``model`` and the links between them."""

    def __init__(self, model: nn.Module, skip: Callable[[str], bool] = lambda p: False,
                 untraced_exits: bool = True) -> None:
        self.model = model
        self.untraced_exits = untraced_exits  # rules look through untraced modules' returns
        self.traces: dict[str, ModuleTrace] = {}
        self.failed: dict[str, str] = {}  # path -> why it could not be traced
        self.path_of: dict[int, str] = {}
        self.sites: dict[str, list[tuple[str, fx.Node]]] = defaultdict(list)
        self._module_at = dict(model.named_modules())
        for path, module in self._module_at.items():
            self.path_of[id(module)] = path
        for path, module in model.named_modules():
            if skip(path):
                continue
            why = traceable_kind(module)
            if why is not None:
                if why != "leaf":
                    self.failed[path] = why
                continue
            if path and not self.sites.get(path) and self._ancestors_traced(path):
                continue  # no traced forward calls it (an nn.Sequential iterated by hand)
            self._trace(path, module)

    # ------------------------------------------------------------------ building
    def _ancestors_traced(self, path: str) -> bool:
        """Every ancestor traced, or a ModuleList/ModuleDict (no forward: only its parent's
        traced code reaches its items, e.g. HRNet's ``self.down[0].forward(y)``)."""
        parts = path.split(".")
        at = self._module_at
        return all(p in self.traces or isinstance(at.get(p), _HOLDERS)
                   for p in (".".join(parts[:i]) for i in range(len(parts))))

    def _pattern(self, path: str, module: nn.Module) -> Pattern:
        cls = getattr(type(module), "_trtqat_base", type(module))
        patterns = [call_pattern(cls, n.args, n.kwargs) for _, n in self.sites.get(path, [])]
        if patterns and patterns[0] is not None and all(p == patterns[0] for p in patterns):
            return patterns[0]
        return default_pattern(cls)

    def _trace(self, path: str, module: nn.Module) -> None:
        try:
            trace = trace_module(path, module, self._pattern(path, module))
        except Exception as exc:  # FX raises many kinds; the module keeps its layers' Q/DQ
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.failed[path] = f"{type(exc).__name__}: {first[:160]}"
            log.debug("cannot trace %s", path or type(module).__name__, exc_info=True)
            return
        self.traces[path] = trace
        for node in trace.graph.nodes:
            child = trace.node_module(node)
            if child is not None and id(child) in self.path_of:
                self.sites[self.path_of[id(child)]].append((path, node))

    # ------------------------------------------------------------------ links
    def child_path(self, path: str, node: fx.Node) -> str | None:
        """The path of the child a ``call_module`` node of ``path`` calls."""
        child = self.traces[path].node_module(node) if path in self.traces else None
        return None if child is None else self.path_of.get(id(child))

    def linked(self, path: str, node: fx.Node) -> str | None:
        """The traced child a call node enters, if the call matches its traced pattern."""
        child = self.child_path(path, node) if node.op == "call_module" else None
        trace = self.traces.get(child) if child is not None else None
        if trace is None:
            return None
        if call_pattern(trace.base, node.args, node.kwargs) != trace.pattern:
            return None
        return child

    def up(self, path: str) -> tuple[str, fx.Node] | None:
        """The one call site of a traced module, when it has exactly one and it links."""
        sites = self.sites.get(path, [])
        if len(sites) != 1:
            return None
        parent, node = sites[0]
        return (parent, node) if self.linked(parent, node) == path else None

    def bound(self, child: str, call: fx.Node) -> dict[str, object]:
        """Flat placeholder name of ``child`` -> the value the call passes."""
        trace = self.traces[child]
        bound = inspect.Signature(list(trace.pattern.params)).bind(*call.args, **call.kwargs)
        out = {}
        for flat, (param, index) in trace.pattern.slots().items():
            value = bound.arguments[param]
            out[flat] = value if index is None else value[index]
        return out

    def output(self, path: str) -> object:
        """The value a traced module returns (a node, or a structure of nodes)."""
        node = next(n for n in reversed(self.traces[path].graph.nodes) if n.op == "output")
        return node.args[0]

    def placeholder(self, path: str, flat: str) -> fx.Node | None:
        for node in self.traces[path].graph.nodes:
            if node.op == "placeholder" and node.target == flat:
                return node
        return None

    # ------------------------------------------------------------------ walking
    def resolve(self, ref: Ref) -> Ref:
        """The node that computes ``ref``'s value: through placeholders of linked modules,
        linked calls and tuple items of their outputs."""
        path, node = ref
        for _ in range(256):
            if node.op == "placeholder":
                up = self.up(path)
                if up is None:
                    return path, node
                value = self.bound(path, up[1]).get(str(node.target))
                if not isinstance(value, fx.Node):
                    return path, node
                path, node = up[0], value
                continue
            if node.op == "call_module":
                child = self.linked(path, node)
                out = self.output(child) if child else None
                if isinstance(out, fx.Node):
                    path, node = child, out
                    continue
                return path, node
            if node.op == "call_function" and node.target is operator.getitem \
                    and isinstance(node.args[0], fx.Node) and isinstance(node.args[1], int):
                src = node.args[0]
                child = self.linked(path, src) if src.op == "call_module" else None
                out = self.output(child) if child else None
                if isinstance(out, (tuple, list)) and -len(out) <= node.args[1] < len(out) \
                        and isinstance(out[node.args[1]], fx.Node):
                    path, node = child, out[node.args[1]]
                    continue
            return path, node
        return path, node

    def consumers(self, ref: Ref) -> list[Ref]:
        """The nodes that use ``ref``'s value, through links (an ``output`` node of an
        unlinked module stands for 'leaves the traced region')."""
        return [user for user, _ in self.uses(ref)]

    def uses(self, ref: Ref, _seen: set | None = None) -> list[tuple[Ref, fx.Node]]:
        """``(consumer, value)`` pairs: each consumer of ``ref`` with the node through which
        it sees the value (a placeholder of a linked child, the getitem of a tuple item)."""
        seen = set() if _seen is None else _seen
        path, node = ref
        if (path, node) in seen:
            return []
        seen.add((path, node))
        found: list[tuple[Ref, fx.Node]] = []
        for user in list(node.users):
            if user.op == "call_module":
                child = self.linked(path, user)
                if child is not None:
                    for flat, value in self.bound(child, user).items():
                        ph = self.placeholder(child, flat) if value is node else None
                        if ph is not None:
                            found += self.uses((child, ph), seen)
                    continue
            if user.op == "output":
                found += self._output_uses(path, user, node, seen)
                continue
            found.append(((path, user), node))
        return found

    def _output_uses(self, path: str, out: fx.Node, node: fx.Node, seen: set
                     ) -> list[tuple[Ref, fx.Node]]:
        up = self.up(path)
        value = out.args[0]
        if up is None:
            return [((path, out), node)]
        parent, call = up
        if value is node:
            return self.uses((parent, call), seen)
        found: list[tuple[Ref, fx.Node]] = []
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if v is not node:
                    continue
                for g in call.users:
                    if g.op == "call_function" and g.target is operator.getitem \
                            and g.args[1] == i:
                        found += self.uses((parent, g), seen)
                    elif g.op != "call_function" or g.target is not operator.getitem:
                        found.append(((parent, g), call))
            return found
        return [((path, out), node)]

    def module(self, ref: Ref) -> nn.Module | None:
        """The child module a ``call_module`` ref calls."""
        path, node = ref
        return self.traces[path].node_module(node) if path in self.traces else None

    def full_name(self, path: str, attr: str) -> str:
        return f"{path}.{attr}" if path else attr

"""Apply the sites of one module to its traced graphs and give it its placed class."""

from __future__ import annotations

from collections import defaultdict

from torch import fx, nn

from trtqat.quant.placement.codegen import graph_source, placed_class
from trtqat.quant.placement.flow import ModelFlow
from trtqat.quant.placement.rules import Site


class RewriteError(RuntimeError):
    """The training-mode graph of a module does not hold a site of its eval graph."""


def unique_attr(module: nn.Module, base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2`` ... : a name ``module`` does not use yet."""
    name, i = base, 1
    while name in taken or hasattr(module, name):
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _key(graph: fx.Graph, node: fx.Node) -> tuple:
    same = [n for n in graph.nodes if n.op == node.op and n.target == node.target]
    return node.op, str(node.target), same.index(node)


def _find(graph: fx.Graph, key: tuple) -> fx.Node:
    op, target, index = key
    same = [n for n in graph.nodes if n.op == op and str(n.target) == target]
    if index >= len(same):
        raise RewriteError(f"no {op} {target} #{index} in the training graph")
    return same[index]


def _apply(graph: fx.Graph, node: fx.Node, site: Site, attr: str) -> None:
    if site.kind == "replace":
        with graph.inserting_before(node):
            new = graph.call_module(attr, tuple(node.args), dict(node.kwargs))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        return
    if site.rule == "concat":
        items = node.args[0]
        quantized = []
        for item in items:
            with graph.inserting_before(node):
                quantized.append(graph.call_module(attr, (item,)))
        node.update_arg(0, type(items)(quantized))
        return
    index = int(site.arg or 0)
    with graph.inserting_before(node):
        q = graph.call_module(attr, (node.args[index],))
    node.update_arg(index, q)


def rewrite_module(flow: ModelFlow, path: str, sites: list[tuple[Site, str]]) -> None:
    """Rewrite the graphs of the module at ``path`` with ``(site, attribute)`` pairs (the
    attributes already set on the module) and switch the module to its placed class."""
    trace = flow.traces[path]
    train_nodes = []
    if trace.train_graph is not None:
        train_nodes = [_find(trace.train_graph, _key(trace.graph, s.node)) for s, _ in sites]
    for i, (site, attr) in enumerate(sites):
        _apply(trace.graph, site.node, site, attr)
        if trace.train_graph is not None:
            _apply(trace.train_graph, train_nodes[i], site, attr)
    trace.graph.lint()
    eval_src = graph_source(trace.graph, "_placed_eval")
    train_src = None
    if trace.train_graph is not None:
        trace.train_graph.lint()
        train_src = graph_source(trace.train_graph, "_placed_train")
    trace.module.__class__ = placed_class(trace.base, trace.pattern, eval_src, train_src)


def by_module(sites: list[Site]) -> dict[str, list[Site]]:
    """Sites grouped by the module whose graph they change, in graph order."""
    out: dict[str, list[Site]] = defaultdict(list)
    for s in sites:
        out[s.path].append(s)
    return out

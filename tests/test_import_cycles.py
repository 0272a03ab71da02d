"""No import cycles between the packages of trtqat (a static check with ``ast``).

Every ``import``/``from ... import`` of every module under ``trtqat/`` is read, at module
level and inside functions alike, and mapped to a *node*: the subpackage it lies in
(``trtqat.train``, ``trtqat.transformers``, ...) or, for a module directly under ``trtqat/``,
that module itself (``trtqat.demo``, ``trtqat.errors``; ``trtqat`` for ``__init__.py``).

The rule:

* the graph of these nodes has no cycle: a lower layer never imports an upper one, not
  even lazily inside a function;
* one exception, the registry: ``trtqat.families`` sits above the stage packages (it builds,
  loads and quantizes models through ``train`` and ``transformers``) and stage code below it
  may still *resolve a family lazily*, with an import of ``trtqat.families`` inside a function
  body. Those lazy edges into ``trtqat.families`` are left out of the graph; a module-level
  import of ``trtqat.families`` from a lower package counts like any other edge.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trtqat

ROOT = Path(trtqat.__file__).parent
REGISTRY = "trtqat.families"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _node(module: str) -> str | None:
    """The graph node of a dotted module name inside trtqat (None outside it): the first
    two parts (``trtqat.train.fp32`` -> ``trtqat.train``, ``trtqat.demo`` -> itself)."""
    parts = module.split(".")
    if parts[0] != "trtqat":
        return None
    return ".".join(parts[:2])


def _is_module(module: str) -> bool:
    """A package, a ``.py`` file or a compiled extension (``trtqat._C``) of that name."""
    path = ROOT.parent / module.replace(".", "/")
    return path.is_dir() or any(path.parent.glob(path.name + ".*"))


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(imported module, lazy)`` of one file; lazy: inside a function body."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - child.level + 1]
                                    + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in child.names]
                modules = [sub for sub in subs if _is_module(sub)]
                # `from trtqat import families` imports the subpackage, not the names of
                # trtqat/__init__.py (the package itself runs first on any import anyway)
                found.extend((m, inner) for m in modules)
                if len(modules) < len(subs):
                    found.append((base, inner))
            visit(child, inner)

    visit(tree, False)
    return found


def package_graph() -> dict[str, dict[str, list[str]]]:
    """``{node: {imported node: [files that import it]}}`` with the lazy registry edges left
    out (see the module doc)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        src = _node(_module_name(path))
        for module, lazy in _imports(path):
            dst = _node(module)
            if dst is None or dst == src or src is None:
                continue
            if dst == REGISTRY and lazy:
                continue  # a family resolved lazily through the registry
            graph[src][dst].append(str(path.relative_to(ROOT.parent)))
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        where = "; ".join(f"{a} -> {b} in {', '.join(sorted(set(graph[a][b]))[:3])}"
                          for a, b in zip(cycle, cycle[1:]))
        raise AssertionError(f"import cycle {' -> '.join(cycle)}: {where}")


def test_the_check_sees_lazy_imports(tmp_path) -> None:
    """The parser finds function-level imports, and a cycle in a made-up graph."""
    mod = ROOT / "train" / "checkpoint.py"
    assert any(lazy for _, lazy in _imports(mod))
    assert find_cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}}) == [
        "a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ["x"]}, "b": {}}) is None


def test_lower_layers_do_not_import_the_families_at_module_level() -> None:
    """Stage packages reach a family only lazily: importing them never imports families."""
    for path in sorted(ROOT.rglob("*.py")):
        src = _node(_module_name(path))
        if src in (REGISTRY, "trtqat.cli"):
            continue
        eager = [m for m, lazy in _imports(path) if not lazy and _node(m) == REGISTRY]
        assert not eager, f"{path} imports {eager[0]} at module level"

"""No import cycles between the packages of trtqat (a static check with ``ast``).

Every ``import``/``from ... import`` of every module under ``trtqat/`` is read, at module
level and inside functions alike, and mapped to a *node*: the subpackage it lies in
(``trtqat.stages``, ``trtqat.families.encoder``, ...) or, for a module directly under ``trtqat/``,
that module itself (``trtqat.stages.demo``, ``trtqat.errors``; ``trtqat`` for ``__init__.py``).

The rule:

* the graph of these nodes has no cycle: a lower layer never imports an upper one, not
  even lazily inside a function;
* nor has the graph of single modules (``trtqat.engines.base``, ``trtqat.engines.registry``,
  ...): inside a package, too, one module is below the other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trtqat

ROOT = Path(trtqat.__file__).parent
DEEP = ("trtqat.families", "trtqat.stages")  # nodes one level deeper


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _node(module: str) -> str | None:
    """The graph node of a dotted module name inside trtqat (None outside it): the first
    two parts (``trtqat.stages.train`` -> ``trtqat.stages``, ``trtqat.stages.demo`` -> itself)."""
    parts = module.split(".")
    if parts[0] != "trtqat":
        return None
    head = ".".join(parts[:2])
    if head in DEEP and len(parts) > 2 and (ROOT.parent / "/".join(parts[:3])).is_dir():
        return ".".join(parts[:3])  # a subpackage: trtqat.families.cnn
    return head


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
            if isinstance(child, ast.If) and _type_checking(child.test):
                continue  # typing-only imports never run
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


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_graph() -> dict[str, dict[str, list[str]]]:
    """``{node: {imported node: [files that import it]}}``."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        src = _node(_module_name(path))
        for module, _lazy in _imports(path):
            dst = _node(module)
            if dst is None or dst == src or src is None:
                continue
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
    mod = ROOT / "stages" / "demo.py"
    assert any(lazy for _, lazy in _imports(mod))
    assert find_cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}}) == [
        "a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ["x"]}, "b": {}}) is None


def test_the_check_skips_typing_only_imports() -> None:
    """``if TYPE_CHECKING:`` imports are not edges; run-time imports of the file are."""
    mod = ROOT / "families" / "cnn" / "qat.py"
    assert "from trtqat.stages.qat import QATConfig" in mod.read_text()
    found = [m for m, _ in _imports(mod)]
    assert "trtqat.runs.loop" in found and "trtqat.stages.qat" not in found


def test_families_never_import_stages() -> None:
    """Stages (above) call family hooks; a family reaches no stage, not even lazily."""
    graph = package_graph()
    bad = {a: b for a in graph if a.startswith("trtqat.families") for b in graph[a]
           if b.startswith("trtqat.stages")}
    assert not bad, bad


def module_graph() -> dict[str, dict[str, list[str]]]:
    """``{module: {imported module: [the importing file]}}``, every trtqat module a node (a
    name imported from a module counts as that module)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        src = _module_name(path)
        for module, _lazy in _imports(path):
            while module.startswith("trtqat.") and not _is_module(module):
                module = module.rpartition(".")[0]
            if module.startswith("trtqat.") and module != src:
                graph[src][module].append(str(path.relative_to(ROOT.parent)))
    return graph


def test_no_import_cycle_between_modules() -> None:
    """No two modules import each other, directly or round a loop, not even lazily (the
    engines' base -> fileformat -> registry -> base was one)."""
    graph = module_graph()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle {' -> '.join(cycle or [])}"

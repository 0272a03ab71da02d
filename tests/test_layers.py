"""The layer rules of docs/ARCHITECTURE.md: which trtqat package may import which, and no
module over 400 lines. Imports anywhere in a module count (also those inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trtqat"
MAX_LINES = 400
# base modules (and the top-level package itself, for __version__; _C is the C++ extension)
BASE = {"errors", "atomic", "finite", "arrays", "optional", "lazy", "version", "variants", "formats",
        "runopts", "sizes", "outputs", "tables", "out_paths", "checks", "threads", "progress", "_C", "trtqat"}
COMPAT = ("nn", "calib", "tensor_quant", "quant_modules", "optim", "utils")
ALLOWED = {
    "api": BASE | {"stages", "families", "runs", "export", "engines", "quant"},
    "stages": BASE | {"families", "runs", "export", "engines", "quant"},
    "families": BASE | {"runs", "export", "engines", "quant"},
    "runs": BASE,
    "engines": BASE,
    "quant": BASE,
    "export": BASE | {"quant"},
    **{name: BASE | {"quant"} for name in COMPAT},
    **{name: {"errors", "trtqat"} for name in BASE - {"trtqat", "_C"}},
}


def _unit(module: str) -> str | None:
    """``trtqat.quant.calib.registry`` -> ``quant``; ``trtqat`` -> ``trtqat``."""
    parts = module.split(".")
    if parts[0] != "trtqat":
        return None
    return parts[1] if len(parts) > 1 else "trtqat"


def _typing_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports that never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")
                                                ) == "TYPE_CHECKING":
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def _imports(path: Path) -> set[str]:
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(_unit(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(_unit(node.module))
            if node.module == "trtqat":  # from trtqat import quant
                found.update(a.name for a in node.names if (PACKAGE / a.name).exists()
                             or (PACKAGE / f"{a.name}.py").exists())
    return {u for u in found if u}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _unit_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    if rel == Path("__init__.py"):
        return "trtqat"
    return rel.parts[0].removesuffix(".py")


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_package_imports_only_the_layers_below(unit: str) -> None:
    bad = []
    for path in _modules():
        if _unit_of(path) != unit:
            continue
        extra = _imports(path) - ALLOWED[unit] - {unit}
        if extra:
            bad.append(f"{path.relative_to(PACKAGE)} imports {sorted(extra)}")
    assert not bad, bad


def test_nothing_but_the_entry_points_imports_cli() -> None:
    bad = [str(p.relative_to(PACKAGE)) for p in _modules()
           if _unit_of(p) not in ("cli", "__main__") and "cli" in _imports(p)]
    assert not bad, bad


def test_no_module_over_the_line_limit() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_scan_sees_function_level_imports(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text("import os\nfrom trtqat import quant\n"
                   "def f():\n    from trtqat.engines.registry import backend_info\n")
    assert _imports(mod) == {"trtqat", "quant", "engines"}

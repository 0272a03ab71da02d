"""``import trtqat.engines`` never imports tensorrt/pycuda/cuda-python nor touches CUDA."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trtqat

HEAVY = ("tensorrt", "pycuda", "cuda")
PACKAGE = Path(trtqat.__file__).parent

PROBE = r"""
import importlib.abc, sys
import trtqat            # torch may load cuda-python itself; trtqat.engines must add nothing
before = set(sys.modules)

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorrt", "pycuda") or name.startswith("cuda.bindings"):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, Block())
import trtqat.engines
import trtqat.engines.cuda, trtqat.engines.ort, trtqat.engines.trt, trtqat.engines.trt_runner
import trtqat.engines.timing, trtqat.cli.exec_cmd, trtqat.cli.cmd_build
from trtqat.engines import backend_names
assert backend_names() == ["ort", "tensorrt"]
new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("tensorrt", "pycuda", "cuda"))
assert not new, new
import torch
assert not torch.cuda.is_initialized()
print("ok")
"""


def test_import_engines_loads_no_gpu_library() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def _module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Imports that run when the module is imported (not inside functions/classes' methods)."""
    found = []

    def walk(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((node.lineno, node.module))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []):
                        walk(child.body if isinstance(child, ast.ExceptHandler) else [child])
            elif isinstance(node, ast.ClassDef):
                walk([n for n in node.body if not isinstance(n, ast.FunctionDef)])

    walk(tree.body)
    return found


def test_no_top_level_import_of_gpu_libraries_anywhere_in_trtqat() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for line, module in _module_level_imports(ast.parse(path.read_text())):
            if module.split(".")[0] in HEAVY:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not offenders, offenders


def test_import_scan_sees_imports_hidden_in_try_and_if() -> None:
    source = ("import os\ntry:\n    import tensorrt as trt\nexcept ImportError:\n"
              "    from cuda.bindings import runtime\nif True:\n    import pycuda.driver\n"
              "def f():\n    import tensorrt\n")
    assert _module_level_imports(ast.parse(source)) == [
        (1, "os"), (3, "tensorrt"), (5, "cuda.bindings"), (7, "pycuda.driver")]

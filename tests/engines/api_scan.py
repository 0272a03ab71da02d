"""Static check of the TensorRT attributes trtqat's TensorRT modules touch.

Follows values that come from the ``tensorrt`` module through assignments (``x = trt.Builder(
logger)``, ``self.context = engine.create_execution_context()``), known return types and a
parameter naming convention (``trt``, ``builder``, ``network``, ``config``, ``cuda_engine``,
``context``), and reports every ``Class.member`` / module attribute reached. An access to a
name that only TensorRT 10 has counts as guarded when it sits under ``if hasattr(X, "NAME")``
or ``if trt_major(trt) < 11`` (or the else branch of ``>= 11``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

MODULE = ("module",)
# what calls on TensorRT objects (and trtqat's own helpers) return
RETURNS = {
    "Builder.create_network": "INetworkDefinition",
    "Builder.create_builder_config": "IBuilderConfig",
    "Builder.create_optimization_profile": "IOptimizationProfile",
    "Builder.build_serialized_network": "IHostMemory",
    "IBuilderConfig.create_timing_cache": "ITimingCache",
    "IBuilderConfig.get_timing_cache": "ITimingCache",
    "ITimingCache.serialize": "IHostMemory",
    "OnnxParser.get_error": "ParserError",
    "INetworkDefinition.get_input": "ITensor",
    "INetworkDefinition.get_output": "ITensor",
    "Runtime.deserialize_cuda_engine": "ICudaEngine",
    "ICudaEngine.create_execution_context": "IExecutionContext",
    "ICudaEngine.serialize": "IHostMemory",
    "ICudaEngine.create_engine_inspector": "EngineInspector",
}
CONSTRUCTORS = {"Builder", "Runtime", "OnnxParser", "Logger"}
HELPERS = {"import_tensorrt": MODULE, "deserialize": ("inst", "ICudaEngine"),
           "make_logger": ("inst", "Logger"), "cuda_engine": ("inst", "ICudaEngine")}
PARAMS = {"trt": MODULE, "builder": ("inst", "Builder"),
          "network": ("inst", "INetworkDefinition"), "config": ("inst", "IBuilderConfig"),
          "cuda_engine": ("inst", "ICudaEngine"), "context": ("inst", "IExecutionContext")}


@dataclass(frozen=True)
class Access:
    line: int
    name: str  # "Class.member" or a module attribute
    guarded_10: bool  # under a TensorRT-10-only guard


def _type_of(node: ast.AST, env: dict[str, tuple], selfenv: dict[str, tuple]) -> tuple | None:
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            return selfenv.get(node.attr)
        base = _type_of(node.value, env, selfenv)
        if base == MODULE:
            return ("class", node.attr)
        return None
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            found = _type_of(value, env, selfenv)
            if found:
                return found
        return None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in HELPERS:
            return HELPERS[func.id]
        if isinstance(func, ast.Attribute):
            if func.attr in HELPERS and func.attr not in RETURNS:
                base = _type_of(func.value, env, selfenv)
                if base is None or base[0] != "inst":
                    return HELPERS[func.attr]
            base = _type_of(func.value, env, selfenv)
            if base == MODULE and func.attr in CONSTRUCTORS:
                return ("inst", func.attr)
            if base and base[0] == "inst":
                ret = RETURNS.get(f"{base[1]}.{func.attr}")
                return ("inst", ret) if ret else None
    return None


def _guard(test: ast.AST) -> tuple[bool, bool]:
    """(body is TensorRT-10-only, orelse is TensorRT-10-only)."""
    for node in ast.walk(test):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"):
            return True, False
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and isinstance(
                node.left.func, ast.Name) and node.left.func.id == "trt_major":
            op, right = node.ops[0], node.comparators[0]
            if isinstance(right, ast.Constant) and right.value == 11:
                if isinstance(op, ast.Lt):
                    return True, False
                if isinstance(op, ast.GtE):
                    return False, True
    return False, False


class _Scanner(ast.NodeVisitor):
    def __init__(self, selfenv: dict[str, tuple]) -> None:
        self.selfenv = selfenv
        self.env: dict[str, tuple] = {}
        self.guard = 0
        self.found: list[Access] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        saved = self.env
        self.env = dict(saved)
        for arg in node.args.args + node.args.kwonlyargs:
            if arg.arg in PARAMS:
                self.env[arg.arg] = PARAMS[arg.arg]
        for _ in range(3):  # assignments, to a fixpoint
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign):
                    found = _type_of(sub.value, self.env, self.selfenv)
                    for target in sub.targets:
                        if isinstance(target, ast.Name) and found:
                            self.env[target.id] = found
        self.generic_visit(node)
        self.env = saved

    def visit_If(self, node: ast.If) -> None:
        body10, else10 = _guard(node.test)
        self.visit(node.test)
        for stmts, guarded in ((node.body, body10), (node.orelse, else10)):
            self.guard += guarded
            for stmt in stmts:
                self.visit(stmt)
            self.guard -= guarded

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = _type_of(node.value, self.env, self.selfenv)
        name = None
        if base == MODULE:
            name = node.attr
        elif base and base[0] in ("class", "inst"):
            name = f"{base[1]}.{node.attr}"
        if name:
            self.found.append(Access(node.lineno, name, self.guard > 0))
        self.generic_visit(node)


def _self_types(tree: ast.AST) -> dict[str, tuple]:
    selfenv: dict[str, tuple] = {}
    for _ in range(4):
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            env = {a.arg: PARAMS[a.arg] for a in func.args.args if a.arg in PARAMS}
            for sub in ast.walk(func):
                if isinstance(sub, ast.Assign):
                    found = _type_of(sub.value, env, selfenv)
                    for target in sub.targets:
                        if found and isinstance(target, ast.Name):
                            env[target.id] = found
                        if (found and isinstance(target, ast.Attribute)
                                and isinstance(target.value, ast.Name)
                                and target.value.id == "self"):
                            selfenv[target.attr] = found
    return selfenv


def scan(source: str) -> list[Access]:
    """Every TensorRT attribute reached in ``source``."""
    tree = ast.parse(source)
    scanner = _Scanner(_self_types(tree))
    scanner.visit(tree)
    return scanner.found


def is_known(name: str, api: frozenset[str]) -> bool:
    """``name`` is in ``api``, allowing pybind11's exported Severity values
    (``Logger.WARNING``), the nested ``ILogger.Severity``, constructors and ``__version__``."""
    if name in api or name == "__version__":
        return True
    cls, _, member = name.partition(".")
    if cls in ("Logger", "ILogger") and member.isupper():
        return f"Severity.{member}" in api
    if name == "ILogger.Severity":
        return "Severity" in api
    return member == "__init__" and cls in api

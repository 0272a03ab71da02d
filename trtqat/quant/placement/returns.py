"""Which child computes what a module FX cannot trace returns, read from its source.

A module whose forward cannot be traced (timm's LiteMLA: a ``with torch.autocast`` block, a
branch on the device) is one opaque call to the graph rules, so a residual Add after it sees
neither input come from a conv. Its ``forward`` most often ends in a projection, though:
``out = self.proj(out)`` / ``return out``. :func:`returning_child` finds that child from the
code, so the residual rule can look through it as it looks through traced modules.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable

from torch import nn


def _self_call(value: ast.AST) -> str | None:
    """``attr`` of a ``self.attr(...)`` call, else None."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
            isinstance(value.func.value, ast.Name) and value.func.value.id == "self":
        return value.func.attr
    return None


def _assigned(stmt: ast.stmt, name: str) -> ast.AST | None:
    """The value ``stmt`` binds to ``name`` (a plain ``name = value``), else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == name:
        return stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and \
            stmt.target.id == name:
        return stmt.value
    return None


def _binds(stmt: ast.stmt, name: str) -> bool:
    """``stmt`` may (re)bind ``name`` in any other way than a plain assignment."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in ast.walk(stmt))


def _returned_attr(body: list[ast.stmt]) -> str | None:
    """The ``self.attr`` child whose call's result the function body returns as its last
    statement: ``return self.attr(...)`` or ``x = self.attr(...)`` ... ``return x`` (with
    no other binding of ``x`` in between)."""
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    value = body[-1].value
    attr = _self_call(value)
    if attr is not None or not isinstance(value, ast.Name):
        return attr
    for stmt in reversed(body[:-1]):
        bound = _assigned(stmt, value.id)
        if bound is not None:
            return _self_call(bound)
        if _binds(stmt, value.id):
            return None  # rebound by a loop, a with block, an augmented assignment ...
    return None


@functools.lru_cache(maxsize=256)
def _forward_returns(forward: Callable) -> str | None:
    """The ``self.<attr>`` whose call ``forward`` returns (parsed once per function)."""
    try:
        source = textwrap.dedent(inspect.getsource(forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return _returned_attr(func.body)


def returning_child(module: nn.Module) -> nn.Module | None:
    """The child module whose output ``module.forward`` returns unchanged, read from the
    forward's source; None when that is not plain to see (no source, a branch, an op after
    the last child call)."""
    try:
        attr = _forward_returns(type(module).forward)
    except TypeError:  # an unhashable forward
        return None
    child = getattr(module, attr, None) if attr else None
    return child if isinstance(child, nn.Module) else None

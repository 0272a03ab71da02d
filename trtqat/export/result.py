"""What an export wrote and how it was checked, and the check-then-rename writer."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from trtqat.atomic import publish, temp_path, write_failed
from trtqat.export import validate as val
from trtqat.export.errors import ExportError, ValidationError
from trtqat.export.lint import LintReport


@dataclass
class ExportResult:
    """What :func:`export_onnx` wrote and how it was checked."""

    path: Path
    variant: str
    opset: int
    dynamic_batch: bool
    checks: list[val.Check] = field(default_factory=list)
    lint: LintReport | None = None
    notes: list[str] = field(default_factory=list)
    dynamic_axes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and (self.lint is None or self.lint.ok)

    def lines(self) -> list[str]:
        """Per-check lines, as ``trtqat export`` prints them."""
        out = [c.line() for c in self.checks] + [f"NOTE  {n}" for n in self.notes]
        if self.lint is not None:
            out.append(f"{'PASS' if self.lint.ok else 'FAIL'}  TensorRT Q/DQ lint: "
                       f"{self.lint.summary()}")
            out += [f"      {f.line()}" for f in self.lint.findings]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "variant": self.variant, "opset": int(self.opset),
                "dynamic_batch": bool(self.dynamic_batch),
                "dynamic_axes": [str(a) for a in self.dynamic_axes], "passed": bool(self.passed),
                "checks": [{"name": str(c.name), "passed": bool(c.passed),
                            "detail": str(c.detail)} for c in self.checks],
                "lint": None if self.lint is None else self.lint.lines(),
                "notes": [str(n) for n in self.notes]}


def write_checked(model: onnx.ModelProto, result: ExportResult,
                  validate: Callable[[str], None] | None = None) -> ExportResult:
    """Save ``model`` to a temporary file beside ``result.path``, check it, then rename it.

    ``onnx.checker`` (full check) always runs; ``validate(tmp_path)`` adds its checks and
    lint to ``result``. Any failed check raises :class:`ValidationError` and keeps no file.
    """
    path = result.path
    try:
        tmp = str(temp_path(path))
    except OSError as exc:
        raise write_failed(path, exc) from None
    try:
        try:
            onnx.save(model, tmp)
        except OSError as exc:  # a full disk: one line, the temporary file goes
            raise write_failed(path, exc) from None
        onnx.checker.check_model(tmp, full_check=True)
        result.checks.append(val.Check("onnx.checker", True, "full check and strict shape "
                                       f"inference (opset {result.opset})"))
        if validate is not None:
            validate(tmp)
            if result.lint is not None:
                result.lint.source = str(path)
        if not result.passed:
            failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.passed]
            if result.lint is not None and not result.lint.ok:
                failed.append(f"lint ({result.lint.errors[0].line()})")
            raise ValidationError(f"{path.name} failed: {'; '.join(failed)}; no file kept",
                                  result)
        try:
            publish(tmp, path)
        except OSError as exc:
            raise write_failed(path, exc) from None
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{path.name} is not valid ONNX: "
                          f"{str(exc).splitlines()[0][:300]}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return result

def is_trtqat_onnx(path: Path) -> bool:
    """``path`` is an ONNX model trtqat exported (producer ``trtqat``): one it may replace."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # any parse failure: not an ONNX model
        return False
    return model.producer_name == "trtqat" and len(model.graph.node) > 0


def refuse_foreign_onnx(path: str | os.PathLike, flag: str = "path") -> None:
    """Refuse to write an ONNX model over an existing file trtqat did not export
    (:class:`~trtqat.out_paths.OutputPathError`, one line naming the fix)."""
    from trtqat.out_paths import check_output_file

    check_output_file(path, flag, (), is_trtqat_onnx, "an ONNX model trtqat exported")


def check_writable(folder: str | os.PathLike) -> Path:
    """Create ``folder`` if needed and prove a file can be written there."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ExportError(f"cannot write to output folder {folder}: "
                          f"{exc.strerror or exc}") from None
    return folder

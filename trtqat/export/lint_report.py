"""Q/DQ lint results: the rule ids, one finding per problem, and the report ``trtqat lint``
prints. The checks themselves are in :mod:`trtqat.export.lint`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

RULES = {
    "no-qdq": "the graph holds no QuantizeLinear/DequantizeLinear (not an INT8 Q/DQ model)",
    "opset": "per-channel Q/DQ needs opset >= 13",
    "unquantized-input": "a Conv/Gemm/MatMul has DQ on one of its two inputs only (activation "
                         "and weight, or the two operands of an attention MatMul)",
    "float-layer": "a Conv/Gemm/MatMul has no DQ at all and runs in float",
    "weight-axis": "weight scales are not per output channel on the right axis",
    "per-tensor-weight": "weight scale is per tensor (per channel is more accurate)",
    "zero-point": "a Q/DQ zero-point is missing, not int8 (or FP8 E4M3), or not 0",
    "scale": "a Q/DQ scale is not a constant initializer, or not positive and finite",
    "activation-per-channel": "an activation Q/DQ is not per tensor",
    "unpaired-qdq": "a QuantizeLinear output does not go only into DequantizeLinear",
    "residual-add": "a residual Add has no Q/DQ on its identity input",
    "concat-scales": "Concat inputs do not share one scale",
    "shared-tensor-scales": "one tensor is quantized with different scales (TensorRT reformats)",
    "maxpool-scales": "Q/DQ around a MaxPool have different scales",
    "no-int8-form": "a quantized tensor feeds an op with no INT8 form in TensorRT",
    "no-fp8-form": "an FP8 Q/DQ feeds an op TensorRT runs in FP16/FP32, not FP8",
    "mixed-formats": "the file holds both INT8 and FP8 zero points (one format per file)",
    "fp8-small-conv": "an FP8 Conv has <= 16 input or output channels (slower than FP16)",
}


@dataclass(frozen=True)
class Finding:
    """One lint result, tied to a node."""

    rule: str
    severity: str  # "error" | "warning" | "info" (left in float on purpose)
    node: str
    message: str

    def line(self) -> str:
        """``error  [rule] node: message``."""
        return f"{self.severity:<7} [{self.rule}] {self.node}: {self.message}"


@dataclass
class LintReport:
    """Findings of :func:`lint_model`; ``ok`` when there is no error."""

    findings: list[Finding] = field(default_factory=list)
    source: str = "<model>"

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def infos(self) -> list[Finding]:
        """Findings on layers left in float on purpose (``--skip-layers``)."""
        return [f for f in self.findings if f.severity == "info"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def rules(self) -> set[str]:
        """Ids of the rules that fired."""
        return {f.rule for f in self.findings}

    def summary(self) -> str:
        text = f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        return text + (f", {len(self.infos)} skipped on purpose" if self.infos else "")

    def lines(self) -> list[str]:
        return [f.line() for f in self.findings]


def format_report(report: LintReport, show: Iterable[str] = ("error", "warning")) -> str:
    """Findings then a summary line, as ``trtqat lint`` prints them."""
    lines = [f.line() for f in report.findings if f.severity in show]
    lines.append(f"{report.source}: {report.summary()}")
    return "\n".join(lines)

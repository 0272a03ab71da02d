"""ONNX export: FP32, FP16, INT8 Q/DQ and INT8+FP16 variants, each checked numerically,
plus the TensorRT Q/DQ placement lint.

Lower layers only: this package knows ``trtqat.quant`` and nothing of engines.
"""

from trtqat.export.errors import ExportError, LintError, ValidationError
from trtqat.export.fold_bn import fold_batchnorm, fold_conv_bn
from trtqat.export.fp16 import convert_to_fp16
from trtqat.export.lint import RULES, Finding, LintReport, format_report, lint_model
from trtqat.export.naming import VARIANTS, artifact_name, expand_variants
from trtqat.export.onnx_export import (
    Exporter,
    ExportResult,
    check_quantizers,
    export_onnx,
    make_example_inputs,
)
from trtqat.export.validate import Check

__all__ = [
    "RULES", "VARIANTS", "Check", "ExportError", "ExportResult", "Exporter", "Finding",
    "LintError", "LintReport", "ValidationError", "artifact_name", "check_quantizers",
    "convert_to_fp16", "expand_variants", "export_onnx", "fold_batchnorm", "fold_conv_bn",
    "format_report", "lint_model", "make_example_inputs",
]

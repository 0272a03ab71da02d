"""``trtqat lint``: the TensorRT Q/DQ placement check of an ONNX file."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O

SUMMARY = "check Q/DQ placement for fully INT8 TensorRT engines"
DESCRIPTION = (
    "Check that an ONNX file's Q/DQ nodes let TensorRT build a fully INT8 engine: DQ on every "
    "Conv/Gemm/MatMul input, per-channel weight scales on the right axis, zero-points 0, "
    "quantized residual Adds, one scale per Concat, no quantized tensor fed to an op with no "
    "INT8 form; attention MatMuls (Q.K^T, P.V) need Q/DQ on both operands. Layers the export "
    "left in float on purpose (--skip-layers, recorded in the file's metadata) are counted as "
    "'skipped on purpose', not warned about. Exits 1 on errors.")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``lint`` subcommand."""
    p = O.command(subparsers, "lint", SUMMARY, DESCRIPTION)
    p.add_argument("onnx", nargs="+", help="ONNX file(s)")
    p.add_argument("--strict", action="store_true", help="fail on warnings too")
    p.add_argument("--errors-only", action="store_true", help="print errors only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Lint each file; 1 if any has errors (or warnings with --strict)."""
    from trtqat.export.lint import format_report, lint_model

    status = 0
    for path in args.onnx:
        report = lint_model(path)
        show = ("error",) if args.errors_only else ("error", "warning")
        print(format_report(report, show))
        if report.errors or (args.strict and report.warnings):
            status = 1
    return status

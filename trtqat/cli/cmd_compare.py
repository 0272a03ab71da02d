"""``trtqat compare``: FP32, FP16, PTQ and QAT engines side by side, accuracy and speed."""

from __future__ import annotations

import argparse

from trtqat.cli.cmd_train import image_size_arg
from trtqat.cli.validate import (
    finite_float,
    int_list,
    int_range,
    non_negative_int,
    positive_int,
    writable_dir,
)
from trtqat.engines.registry import backends_help, default_backend


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat compare`` to the command line."""
    p = subparsers.add_parser(
        "compare", help="measure FP32/FP16/PTQ/QAT engines on the same data: accuracy and speed",
        description="Finds every checkpoint under --run (fp32, ptq-*, qat sub-folders), exports "
        "and builds what is missing, then measures each engine's top-1/top-5 on the validation "
        "split and its median latency and throughput with trtexec's measurement model. Writes "
        "report.md, report.json and report.png into --out. A variant that fails is reported "
        "with its error; the others still run. Sentence encoders (runs of `trtqat calibrate "
        "--model minilm`, or encoder ONNX files) are scored by embedding fidelity on the "
        "corpus' held-out sentences instead: mean cosine and Spearman vs the FP32 PyTorch model; "
        "their latency/throughput use sentences padded to --max-length tokens.",
        epilog="examples:\n  trtqat compare --run runs/demo --batch-sizes 1,32\n"
        "  trtqat compare --run runs/minilm --max-length 128",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default=None, help="folder holding the fp32/ptq-*/qat run folders")
    p.add_argument("--onnx", nargs="+", default=(), help="explicit ONNX files to compare too")
    p.add_argument("--variants", type=lambda s: tuple(s.split(",")), default=(),
                   help="only these variants, e.g. fp32,qat-int8")
    p.add_argument("--backend", default=default_backend(), help=backends_help())
    p.add_argument("--batch-sizes", type=int_list, default=(1, 32),
                   help="latency at the first, throughput at the last (default 1,32)")
    p.add_argument("--export-dir", default="export", type=writable_dir,
                   help="where missing ONNX files are written")
    p.add_argument("--out", default="engines", type=writable_dir,
                   help="where engines and the report go")
    p.add_argument("--data", default=None, help="digits, synthetic or an ImageFolder path; "
                   "encoders: builtin or a text file (default: the runs')")
    p.add_argument("--max-length", "--seq-len", type=int_range(2), default=128,
                   dest="max_length", help="encoders: tokens per sentence (default 128)")
    p.add_argument("--num-sentences", type=positive_int, default=500,
                   help="encoders: held-out sentences scored (default 500)")
    p.add_argument("--model", default=None, help="encoders: FP32 reference and tokenizer of "
                   "--onnx files without a run (minilm or a folder; default: from the file)")
    p.add_argument("--image-size", type=image_size_arg, default=None, metavar="N|HxW",
                   help="default: the runs' (preprocessing too: resize, mean/std, channels)")
    p.add_argument("--duration", type=finite_float(gt=0, unit="seconds"), default=3.0,
                   dest="duration_s",
                   help="seconds of measurement per variant and batch size (trtexec: 3)")
    p.add_argument("--warmup", type=finite_float(ge=0, unit="ms"), default=200.0,
                   dest="warmup_ms", help="warm-up in ms")
    p.add_argument("--threads", type=non_negative_int, default=None,
                   help="ONNX Runtime intra-op threads")
    p.add_argument("--fresh", action="store_true", help="re-export and rebuild everything")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat compare``."""
    from trtqat.compare.run import CompareConfig, compare

    fields = CompareConfig.__dataclass_fields__
    report = compare(CompareConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    # a failed variant or a failed check is in the report, and in the exit code
    return 1 if report.get("partial") or report.get("failed_checks") else 0

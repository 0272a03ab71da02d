"""``trtqat compare``: FP32, FP16, PTQ and QAT engines side by side, accuracy and speed."""

from __future__ import annotations

import argparse

from trtqat.cli import options as O
from trtqat.cli.validate import finite_float
from trtqat.engines.registry import default_backend
from trtqat.stages.compare import DEMO_RUNS

SUMMARY = "measure FP32/FP16/PTQ/QAT engines on the same data: accuracy and speed"
DESCRIPTION = (
    "Finds every checkpoint under --run (fp32, ptq-*, qat sub-folders), exports and builds what "
    "is missing, then measures each engine's top-1/top-5 on the validation split and its median "
    "latency and throughput with trtexec's measurement model. Writes report.md, report.json and "
    "report.png into --out (default: engines/<name of the run folder>, where `trtqat demo` puts "
    "that model's engines and report, which are then reused). A variant that fails is "
    "reported with its error; the others still run. Sentence encoders (runs of `trtqat calibrate --model minilm`, or encoder ONNX files) "
    "are scored by embedding fidelity on the corpus' held-out sentences instead: mean cosine and "
    "Spearman vs the FP32 PyTorch model; their latency/throughput use sentences padded to "
    "--max-length tokens.")
EPILOG = ("examples:\n  trtqat compare                       # after `trtqat demo`: its model\n"
          "  trtqat compare --run runs/demo/resnet18 --batch-sizes 1,32\n"
          "  trtqat compare --run runs/minilm --max-length 128")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trtqat compare`` to the command line."""
    p = O.command(subparsers, "compare", SUMMARY, DESCRIPTION, EPILOG)
    p.add_argument("--run", default=None, help="folder holding the fp32/ptq-*/qat run folders, "
                   "or a folder holding one model's such folders (default with no --onnx: "
                   f"{DEMO_RUNS}, the demo's, when it exists)")
    O.add_trust_model_file(p)
    p.add_argument("--onnx", nargs="+", default=(), help="explicit ONNX files to compare too")
    p.add_argument("--variants", type=O.csv, default=(),
                   help="only these variants, e.g. fp32,qat-int8")
    O.add_backend(p, default_backend())
    O.add_export_dir(p, "where missing ONNX files are written")
    O.add_out(p, None, "where engines and the report go (default: engines/<run folder name>; "
              "engines with --onnx only); an earlier compare or demo report there is replaced",
              metavar=None)
    O.add_data(p, None, "digits, synthetic or an ImageFolder path; encoders: builtin or a text "
               "file (default: the runs')", metavar=None)
    O.add_max_length(p, 128, "encoders: tokens per sentence")
    O.add_num_sentences(p, 500, "encoders: held-out sentences scored")
    O.add_model(p, help="encoders: FP32 reference and tokenizer of --onnx files without a run "
                "(minilm or a folder; default: from the file)")
    O.add_image_size(p, None, "default: the runs' (preprocessing too: resize, mean/std, "
                     "channels)")
    O.add_measure_args(p, 3.0, "seconds of measurement per variant and batch size (trtexec: 3)")
    p.add_argument("--warmup", type=finite_float(ge=0, unit="ms"), default=200.0,
                   dest="warmup_ms", help="warm-up in ms")
    O.add_threads(p)
    O.add_fresh(p, "re-export and rebuild everything")
    O.add_metric_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``trtqat compare``."""
    from trtqat.stages.compare.run import CompareConfig, compare

    report = compare(O.config_from(CompareConfig, args))
    # a failed variant or a failed check is in the report, and in the exit code
    return 0 if report.ok else 1

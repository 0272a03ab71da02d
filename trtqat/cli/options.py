"""Command-line options defined once, for every ``trtqat`` command.

Each option that more than one command takes is spelled here, once, with one short form
where it has one (``--out/-o``, ``--model/-m``, ``--checkpoint/-c``, ``--batch-size/-b``,
``--workers/-j``) and one type; a command picks the options and groups it takes and may word
an option's help (and its default) for itself (``tests/test_cli_options.py`` walks every
subcommand's parser to hold this):

    p = command(subparsers, "train", SUMMARY, DESCRIPTION, EPILOG)
    g = p.add_argument_group("model")
    add_model(g, default="resnet18", help="...")
    add_data_args(p)            # --data, --image-size, preprocessing, batches, --seed, ...
    add_optim_args(p)           # --lr, --min-lr, --momentum, --weight-decay, --opt, ...
    add_run_args(p, "runs/x")   # --out, --overwrite, --device, ... and the speed options

:func:`config_from` turns the parsed options into a run config (fields of the same names);
:func:`print_summary` prints a verb's closing line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from trtqat.cli.family_help import families_help, method_help  # noqa: F401  (O.method_help ...)
from trtqat.cli.validate import (
    BadValue,
    finite_float,
    finite_float_list,
    int_list,
    int_range,
    non_negative_int,
    positive_int,
    seed_int,
    threads_int,
    writable_dir,
    writable_file,
)

if TYPE_CHECKING:
    from trtqat.families.types import StageResult

Group = argparse.ArgumentParser | argparse._ArgumentGroup

EPILOG_DIST = ("Several processes: torchrun --nproc_per_node=N -m trtqat {cmd} ... "
               "(DistributedDataParallel; gloo on CPU, nccl on GPU; rank 0 writes the run).")
DATA_HELP = ("'digits' (scikit-learn's 8x8 digits, resized), 'synthetic' (random, for speed "
             "runs) or an ImageFolder PATH with train/ and val/")


def formatter(prog: str) -> argparse.HelpFormatter:
    """Help that shows defaults and keeps the epilog's line breaks."""

    class _F(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        def _get_help_string(self, action: argparse.Action) -> str:
            if action.default is None or isinstance(action.default, bool):
                return action.help or ""
            return super()._get_help_string(action)

    return _F(prog, max_help_position=32)


def fill(text: str) -> str:
    """Wrap a description for help output (the formatter keeps raw line breaks)."""
    return textwrap.fill(text, 88, break_on_hyphens=False)


def csv(text: str) -> tuple[str, ...]:
    """Parse 'a,b,c' into a tuple of names."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


SECONDS = finite_float(gt=0, unit="seconds")


def image_size_arg(text: str) -> int | tuple[int, int]:
    """argparse type of --image-size/--resize: N or HxW."""
    from trtqat.sizes import DataSourceError, parse_size

    try:
        return parse_size(text)
    except DataSourceError as exc:  # a refused value: exit 1 like every validator's
        raise BadValue(str(exc).split(": ", 1)[-1]) from None


# --------------------------------------------------------------------------- single options
def add_out(g: Group, default: str | None, help: str = "run folder: args.yaml, metrics.jsonl, "
            "last.pt, best.pt", metavar: str | None = "RUN_DIR", file: bool = False,
            required: bool = False) -> None:
    """``--out/-o``: the folder a command writes (``file=True``: the one file it writes)."""
    g.add_argument("--out", "-o", default=default, required=required, metavar=metavar,
                   type=writable_file if file else writable_dir, help=help)


def add_model(g: Group, default: str | None = None, help: str = "the model") -> None:
    """``--model/-m``: a model name, folder or ``file.py:factory`` (its family decides), and
    ``--trust-model-file`` (an Ultralytics ``.pt`` is a pickle: it runs code when loaded)."""
    g.add_argument("--model", "-m", default=default, help=help)
    add_trust_model_file(g)


def add_checkpoint(g: Group, required: bool = False, help: str = "checkpoint (a .pt of a "
                   "trtqat run, or its run folder)") -> None:
    """``--checkpoint/-c``: the input checkpoint."""
    g.add_argument("--checkpoint", "-c", required=required, default=None, metavar="PATH",
                   help=help)
    add_trust_model_file(g)


def add_trust_model_file(g: Group) -> None:
    """``--trust-model-file``: import a checkpoint's recorded model file even if it changed,
    and load an Ultralytics ``.pt`` (a pickle). Added once per command."""
    if "--trust-model-file" in g._option_string_actions:  # --checkpoint and --model both add it
        return
    g.add_argument("--trust-model-file", action="store_true",
                   help="run code from model files you have reviewed: a checkpoint of a model "
                   "from a file (--model FILE.py:FACTORY) imports that file again, refused if "
                   "it changed since (its SHA-256 differs); an Ultralytics --model FILE.pt is "
                   "a pickle, which runs code when loaded, refused unless this is given")


def add_onnx(g: Group, required: bool = False, help: str = "the ONNX model") -> None:
    """``--onnx FILE``: the one ONNX model an engine is built from."""
    g.add_argument("--onnx", required=required, metavar="FILE", help=help)


def add_data(g: Group, default: str | None = "digits", help: str = DATA_HELP,
             metavar: str | None = "digits|synthetic|PATH") -> None:
    """``--data``: where the images (or sentences) come from."""
    g.add_argument("--data", default=default, metavar=metavar, help=help)


def add_image_size(g: Group, default: Any = 32, help: str = "input resolution: N (square) "
                   "or HxW, e.g. 224x160", metavar: str | None = "N|HxW") -> None:
    """``--image-size``: N or HxW."""
    g.add_argument("--image-size", type=image_size_arg, default=default, metavar=metavar,
                   help=help)


def add_batch_size(g: Group, default: int | None, help: str = "batch size per process") -> None:
    """``--batch-size/-b``."""
    g.add_argument("--batch-size", "-b", type=positive_int, default=default, help=help)


def add_limit_batches(g: Group, help: str = "use at most N batches per epoch for train and "
                      "val (quick checks)", dest: str = "limit_batches",
                      alias: str | None = None) -> None:
    """``--limit-batches N`` (``alias``: a command's own spelling, listed first)."""
    g.add_argument(*([alias] if alias else []), "--limit-batches", dest=dest, type=positive_int,
                   default=None, metavar="N", help=help)


def add_weights(g: Group) -> None:
    """``--weights``: the float weights of ``--model``."""
    g.add_argument("--weights", default=None, metavar="FILE|NAME",
                   help="float weights of --model: a state_dict or checkpoint file "
                   "(.pt/.pth), or a torchvision weights name (IMAGENET1K_V1, DEFAULT) "
                   "found in the torch hub cache (never downloaded)")


def add_num_classes(g: Group, help: str) -> None:
    """``--num-classes``: output classes of a classifier (at least 2)."""
    g.add_argument("--num-classes", type=int_range(2), default=None, help=help)


def add_epochs(g: Group, default: int | None, help: str) -> None:
    """``--epochs``."""
    g.add_argument("--epochs", type=positive_int, default=default, help=help)


def add_skip_layers(g: Group, help: str = "glob patterns of layers kept in float, e.g. "
                    "'conv1,fc'") -> None:
    """``--skip-layers A,B``."""
    g.add_argument("--skip-layers", type=csv, default=(), metavar="A,B", help=help)


def add_format(g: Group, qat: bool = False, demo: bool = False) -> None:
    """``--format {int8,fp8,int4}`` and ``--block-size {32,64,128}`` (``trtqat.formats``);
    ``demo``: ``--format`` takes several, separated by commas (``fp8,int8``), no block size."""
    from trtqat.formats import BLOCK_SIZES, DEFAULT, FORMATS
    from trtqat.runs.format_options import INT4_EMBEDDINGS_HELP, block_size_help, format_help

    if demo:
        g.add_argument("--format", dest="formats", default=DEFAULT, metavar="FORMATS",
                       help=format_help(demo=True))
        return

    g.add_argument("--format", choices=FORMATS, default=None if qat else DEFAULT,
                   help=format_help(qat).replace("%", "%%"))
    g.add_argument("--block-size", type=int, choices=BLOCK_SIZES, default=None,
                   help=block_size_help())
    if not qat:
        g.add_argument("--int4-embeddings", action="store_true", help=INT4_EMBEDDINGS_HELP)


def add_max_length(g: Group, default: int | None, help: str) -> None:
    """``--max-length`` (also ``--seq-len``): tokens per sentence (encoders)."""
    g.add_argument("--max-length", "--seq-len", dest="max_length", type=int_range(2),
                   default=default, help=help)


def add_num_sentences(g: Group, default: int, help: str) -> None:
    """``--num-sentences``: how many sentences of the corpus (encoders)."""
    g.add_argument("--num-sentences", type=positive_int, default=default, help=help)


def add_device(g: Group, help: str = "auto, cpu, cuda or cuda:N", default: str = "auto") -> None:
    """``--device``: where the model runs."""
    g.add_argument("--device", default=default, help=help)


def add_no_progress(g: Group, help: str = "no progress bars or per-epoch lines") -> None:
    """``--no-progress`` (dest ``progress``)."""
    g.add_argument("--no-progress", dest="progress", action="store_false", help=help)


def add_backend(g: Group, default: str | None, help: str | None = None) -> None:
    """``--backend``: the engine backend (help: the registered backends; the default is
    shown by the help formatter)."""
    from trtqat.engines.registry import backends_help

    g.add_argument("--backend", default=default, help=help or backends_help(""))


BARE_THREADS = -1  # --threads given without N (trtexec's multithreading switch)


def add_threads(g: Group, help: str | None = None, bare: bool = False,
                torch: bool = True) -> None:
    """``--threads N``, N >= 1: the CPU threads of the command, applied by ``trtqat``'s
    entry point before any work (:func:`trtqat.threads.apply_threads`; ``torch``: PyTorch's
    too, else ONNX Runtime's only). ``bare``: also accepted without N, as trtexec's switch:
    :data:`BARE_THREADS`, which the command warns about and drops."""
    from trtqat.threads import DEFAULT_HELP

    g.add_argument("--threads", type=threads_int, default=None, metavar="N",
                   help=help or DEFAULT_HELP,
                   **({"nargs": "?", "const": BARE_THREADS} if bare else {}))
    g.set_defaults(threads_torch=torch)


# --------------------------------------------------------------------------- engines, reports
def add_measure_args(g: Group, duration: float, help: str) -> None:
    """``--batch-sizes`` and ``--duration`` (dest ``duration_s``) of a speed report."""
    g.add_argument("--batch-sizes", type=int_list, default=(1, 32),
                   help="latency at the first, throughput at the last")
    g.add_argument("--duration", type=SECONDS, default=duration, dest="duration_s", help=help)


def add_export_dir(g: Group, help: str) -> None:
    """``--export-dir``: where ONNX files go."""
    g.add_argument("--export-dir", default="export", type=writable_dir, help=help)


def add_fresh(g: Group, help: str) -> None:
    """``--fresh``: redo what earlier runs left."""
    g.add_argument("--fresh", action="store_true", help=help)


# --------------------------------------------------------------------------- option groups
def add_data_args(p: argparse.ArgumentParser, inherit: bool = False,
                  calibration: bool = False, recipe_batch: bool = False) -> None:
    """--data, --image-size, preprocessing, --batch-size, --workers, --seed, --strict."""
    g = p.add_argument_group("data" + (" (default: as in the FP32 run)" if inherit else ""))
    extra = (", a flat folder of images, or a .npy/.npz (N,C,H,W) float array "
             "(FILE.npz:NAME picks one; no labels: calibration only)") if calibration else ""
    add_data(g, None if inherit else "digits", DATA_HELP + extra)
    add_image_size(g, None if inherit else 32)
    g.add_argument("--resize", default=None, metavar="N|HxW|auto",
                   help="image folders: resize before the center crop, the shorter side to N "
                   "or exactly HxW (default auto: shorter side to image size / 0.875)")
    g.add_argument("--mean", type=finite_float_list(), default=None, metavar="M[,M,M]",
                   help="normalization mean per channel (default: ImageNet's; image folders "
                   "only: refused with digits, synthetic and arrays, which ignore it)")
    g.add_argument("--std", type=finite_float_list(gt=0, example="0.229,0.224,0.225"),
                   default=None, metavar="S[,S,S]",
                   help="normalization std per channel (default: ImageNet's; image folders "
                   "only)")
    g.add_argument("--channels", type=int, choices=[1, 3], default=None,
                   help="image channels: 3 (RGB, default) or 1 (grayscale)")
    if recipe_batch:  # the model family's recipe fills it
        add_batch_size(g, None, "batch size per process (default: the model family's "
                       "recipe; CNNs: 32)")
    else:
        add_batch_size(g, None if inherit else 32)
    g.add_argument("--workers", "-j", type=non_negative_int, default=0,
                   help="data loader processes")
    g.add_argument("--seed", type=seed_int, default=0, help="random seed (shuffling, augmentation)")
    g.add_argument("--strict", action="store_true",
                   help="fail on unreadable images (detection data: also on boxes outside "
                   "their image and images without boxes) instead of skipping them with a "
                   "warning")


def add_run_args(p: argparse.ArgumentParser, out: str, resumable: bool = True) -> None:
    """--out, --resume, --overwrite, --device, --limit-batches, --stop-after, --no-progress,
    --threads, and the speed options of :func:`add_accel_args` (the fields of ``RunOptions``)."""
    g = p.add_argument_group("run")
    add_out(g, out)
    if resumable:
        g.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its last.pt (same options)")
        g.add_argument("--stop-after", type=positive_int, default=None, metavar="EPOCHS",
                       help="stop after this epoch, as if interrupted (continue with --resume)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the trtqat run already in --out (only trtqat's files; the old "
                   "run is kept until the new one has a checkpoint)")
    add_device(g)
    add_limit_batches(g)
    add_no_progress(g)
    add_threads(g)
    add_metric_output(g)
    add_accel_args(p)


def add_metric_output(g: Group) -> None:
    """--metric-output: which output of a model with several is trained on and scored."""
    g.add_argument("--metric-output", default=None, metavar="NAME|INDEX",
                   help="for models that return several outputs (a tuple, list or dict): the "
                   "one the loss and metric use, by name (output_1, a dict key) or index "
                   "(default: the first; every output is exported)")


def add_accel_args(p: argparse.ArgumentParser) -> None:
    """--amp, --channels-last, --compile, --cuda-graphs (trtqat.runs.accel)."""
    from trtqat.runopts import AMP_CHOICES

    g = p.add_argument_group("speed (checkpoints stay float32)")
    g.add_argument("--amp", choices=list(AMP_CHOICES), default=None,
                   help="mixed precision: autocast the forward in bfloat16 or float16 (fp16: "
                   "GPU only, with a gradient scaler)")
    g.add_argument("--channels-last", action="store_true",
                   help="NHWC weights and image batches (faster convolutions on GPUs; no "
                   "effect on encoders)")
    g.add_argument("--compile", action="store_true",
                   help="run the model through torch.compile (calibrate: evaluation only; "
                   "statistics are collected eagerly)")
    g.add_argument("--cuda-graphs", action="store_true",
                   help="train/qat of image classifiers on a GPU: replay the whole training "
                   "step (forward, backward, optimizer) as one CUDA graph; for host-bound "
                   "steps (small models or batches); drops a last partial batch")


def add_optim_args(p: argparse.ArgumentParser, inherit: bool = False) -> None:
    """--lr, --min-lr, --momentum, --weight-decay, --opt, --label-smoothing: every default
    None, filled by the model family's recipe (``inherit``: derived from the FP32 run)."""
    from trtqat.runopts import FP32_DEFAULTS, MAX_LR, OPTIMIZERS

    def cnn(name: str) -> str:
        return f"; CNNs: {FP32_DEFAULTS[name]}"

    g = p.add_argument_group("optimizer (default: the model family's recipe"
                             + (", derived from the FP32 run)" if inherit else ")"))
    g.add_argument("--lr", type=finite_float(gt=0, le=MAX_LR, unit="learning rate"),
                   default=None,
                   help="peak learning rate (default: "
                   + ("the family's share of the FP32 lr; CNNs: 1%%, ViTs: 15%%)" if inherit
                      else f"the family's{cnn('lr')} SGD (mobilenet_v2: 0.02), ViTs: 0.002 "
                      "AdamW)"))
    g.add_argument("--min-lr", type=finite_float(ge=0), default=None,
                   help="final learning rate of the cosine schedule"
                   + (" (default: 1%% of --lr)" if inherit else f" (default{cnn('min_lr')})"))
    same = " (default: the FP32 run's)" if inherit else ""
    g.add_argument("--momentum", type=finite_float(ge=0, lt=1), default=None,
                   help="SGD momentum (Nesterov)" + (same or f" (default{cnn('momentum')})"))
    g.add_argument("--weight-decay", "--wd", type=finite_float(ge=0), default=None,
                   help="weight decay" + (same or f" (default{cnn('weight_decay')}, "
                                          "mobilenet_v2: 4e-5)"))
    g.add_argument("--opt", choices=list(OPTIMIZERS), default=None,
                   help="optimizer" + (same or f" (default{cnn('opt')})"))
    g.add_argument("--label-smoothing", type=finite_float(ge=0, lt=1), default=None,
                   help="label smoothing of the cross-entropy loss"
                   + (same or f" (default{cnn('label_smoothing')})"))


# --------------------------------------------------------------------------- commands
def command(subparsers: argparse._SubParsersAction, name: str, summary: str,
            description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``trtqat NAME`` with the shared help layout: ``summary`` in the command
    list, ``description`` wrapped, ``epilog`` as written, defaults shown."""
    return subparsers.add_parser(name, help=summary, description=fill(description),
                                 epilog=epilog, formatter_class=formatter)


# --------------------------------------------------------------------------- running
def config_from(cls: type, args: argparse.Namespace) -> Any:
    """Build the run config ``cls`` from the parsed options of the same names."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if hasattr(args, f.name)}
    return cls(**values)


def print_summary(result: StageResult) -> None:
    """A stage verb's closing line (``result.summary``) on stderr, from rank 0 only."""
    if os.environ.get("RANK", "0") == "0":
        print(result.summary, file=sys.stderr)

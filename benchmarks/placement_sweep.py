"""Issue 24's "Done when" on models the test suite does not contain: each model through
``trtqat.quantize`` (calibrated on synthetic batches), every export variant with its checks,
the Q/DQ lint of the INT8 file and the ONNX Runtime INT8 engine.

Per model it prints one row: the stage that failed (or ``ok``), the residual-add and
float-layer lint warnings of the INT8 file (findings marked "on purpose" are infos, not
counted), the other lint warnings by rule, and the share of the engine's conv/matmul nodes
that ORT runs as integer ops (``int/total``, from the optimised graph the engine runs).
Targets: 0 residual-add, 0 float-layer, integer share >= 90%.

Models: timm (random weights), user-file-style models defined below, and the torchvision
zoo families (``trtqat.stages.zoo.ZOO``). Weights are random; BatchNorm statistics are
settled on the calibration batches first so activations have realistic ranges. A model
that fails is recorded with its stage and error and the sweep goes on. Models run one at a
time (CPU kept modest: ``torch.set_num_threads(--threads)``). Example::

    python benchmarks/placement_sweep.py --models resnet18d,user_se --size 64

Issue 34's models (a weight-standardised ``ScaledStdConv2d`` model and RepVGG in its
training form), INT8 only, with a looser engine agreement floor for random weights::

    python benchmarks/placement_sweep.py --models subclass --variants int8 --min-cosine 0.5
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trtqat  # noqa: E402
from trtqat.stages.zoo import ZOO, settle_batchnorm, synthetic_batches  # noqa: E402

VARIANTS = ("fp32", "fp16", "int8", "int8-fp16")
INT_MM = {"QLinearConv", "NhwcQLinearConv", "ConvInteger", "QGemm", "QLinearMatMul",
          "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention"}
FLOAT_MM_WORDS = ("Conv", "Gemm", "MatMul", "Attention")
TARGET_INT_SHARE = 0.90


# ---------------------------------------------------------------- user-file-style models
def _cbr(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class _SE(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // 4, 1)
        self.fc2 = nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


class _MBConvSE(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.expand = _cbr(c, 2 * c)
        self.dw = _cbr(2 * c, 2 * c, groups=2 * c)
        self.se = _SE(2 * c)
        self.project = nn.Sequential(nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.project(self.se(self.dw(self.expand(x))))


class UserSE(nn.Module):
    """Inverted residuals with squeeze-and-excitation gates."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = _cbr(3, 16, 2)
        self.blocks = nn.Sequential(_MBConvSE(16), _MBConvSE(16))
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class _GNBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(c, c, 3, 1, 1), nn.GroupNorm(4, c)
        self.c2, self.n2 = nn.Conv2d(c, c, 3, 1, 1), nn.GroupNorm(4, c)

    def forward(self, x):
        y = F.silu(self.n1(self.c1(x)))
        return F.silu(x + self.n2(self.c2(y)))


class UserGroupNorm(nn.Module):
    """Residual blocks normalised with GroupNorm."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 2, 1)
        self.blocks = nn.Sequential(_GNBlock(16), _GNBlock(16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class UserConcatUpsample(nn.Module):
    """An FPN-like neck: a downsampled branch upsampled and concatenated with the skip."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = _cbr(3, 16, 2)
        self.down = nn.Sequential(nn.MaxPool2d(2), _cbr(16, 32))
        self.lateral = _cbr(32, 16)
        self.fuse = _cbr(32, 32)
        self.head = nn.Conv2d(32, num_classes, 1)

    def forward(self, x):
        skip = self.stem(x)
        low = self.lateral(self.down(skip))
        up = F.interpolate(low, scale_factor=2.0, mode="nearest")
        y = self.fuse(torch.cat([up, skip], 1))
        return self.head(y).mean((2, 3))


class UserTwoHeads(nn.Module):
    """A shared trunk with a classifier and an auxiliary head, returned as a tuple."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.trunk = nn.Sequential(_cbr(3, 16, 2), _cbr(16, 32, 2))
        self.cls = nn.Linear(32, num_classes)
        self.aux = nn.Conv2d(32, 4, 1)

    def forward(self, x):
        f = self.trunk(x)
        return self.cls(f.mean((2, 3))), self.aux(f)


class UserMHA(nn.Module):
    """Patch embedding, an ``nn.MultiheadAttention`` block with LayerNorms and an MLP."""

    def __init__(self, num_classes: int = 10, dim: int = 32) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        h = self.norm1(t)
        t = t + self.attn(h, h, h, need_weights=False)[0]
        t = t + self.mlp(self.norm2(t))
        return self.head(t.mean(1))


USER = {"user_se": UserSE, "user_groupnorm": UserGroupNorm,
        "user_concat_upsample": UserConcatUpsample, "user_two_heads": UserTwoHeads,
        "user_mha": UserMHA}
TIMM = ("resnet18d", "efficientnet_lite0", "mobilenetv3_small_100", "convnext_atto",
        "vit_tiny_patch16_224")
# issue 34: a Conv2d subclass with its own forward (ScaledStdConv2d), and a model in its
# training form with timm's reparameterize() (RepVGG)
TIMM_SUBCLASS = ("nf_regnet_b0", "repvgg_a0")
FIXED_SIZE = {"vit_tiny_patch16_224": 224}  # timm's ViT at its own size
# torchvision models whose adaptive pooling needs more than --size: VGG's 7 x 7 pool from a
# smaller map is an upsampling GatherND (left in float), at 224 it is the identity
MIN_SIZE = {"vgg11_bn": 224}


def builder(name: str, size: int) -> Callable[[], nn.Module]:
    """The float model of ``name`` (user, timm or torchvision), 10 classes, random weights;
    torchvision's ViTs are built for ``size``."""
    if name in USER:
        return USER[name]
    if name in TIMM or name in TIMM_SUBCLASS:
        import timm

        return lambda: timm.create_model(name, pretrained=False, num_classes=10)
    import torchvision

    extra = {"image_size": size} if name.startswith("vit_") else {}
    return lambda: torchvision.models.get_model(name, weights=None, num_classes=10, **extra)


def all_models() -> list[str]:
    return [*TIMM, *TIMM_SUBCLASS, *USER, *ZOO.values()]


# ---------------------------------------------------------------- one model
@dataclass
class Row:
    name: str
    size: int
    stage: str = "ok"
    error: str = ""
    residual: int | None = None
    float_layer: int | None = None
    other: Counter = field(default_factory=Counter)
    integer: int = 0
    mm_total: int = 0
    float_mm: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)  # seconds per stage


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def _lint(path: Path, row: Row) -> None:
    from trtqat.export.lint import lint_model

    report = lint_model(path)
    warnings = Counter(f.rule for f in report.findings if f.severity in ("warning", "error"))
    row.residual = warnings.pop("residual-add", 0)
    row.float_layer = warnings.pop("float-layer", 0)
    row.other = warnings


def _engine(path: Path, data: list[torch.Tensor], row: Row, threads: int,
            min_cosine: float = 0.98) -> None:
    import numpy as np
    import onnx

    from trtqat.engines.ort_qdq import count_compute_nodes

    name = onnx.load(path, load_external_data=False).graph.input[0].name
    feeds = [{name: x.numpy()} for x in data]
    engine = trtqat.build_engine(path, "ort", threads=threads, calib_feeds=feeds, min_top1=0.0,
                                 min_cosine=min_cosine)
    with engine.runner(threads=threads) as runner:
        outs = runner.infer(feeds[0])
    if not all(np.isfinite(o).all() for o in outs.values()):
        raise RuntimeError("the ORT engine produced non-finite outputs")
    counts = count_compute_nodes(onnx.load_model_from_string(engine.payload))
    row.integer = sum(n for op, n in counts["integer"].items() if op in INT_MM)
    row.float_mm = Counter({op: n for op, n in counts["float"].items()
                            if any(w in op for w in FLOAT_MM_WORDS)})
    row.mm_total = row.integer + sum(row.float_mm.values())


def run_model(name: str, size: int, out: Path, threads: int, calib: int = 3,
              batch: int = 4, variants: tuple[str, ...] = VARIANTS,
              min_cosine: float = 0.98) -> Row:
    """Quantize, export every variant, lint and build the ORT engine of one model."""
    row = Row(name, size)
    t0 = time.perf_counter()
    stage = "build"
    last = [t0]

    def lap(name: str) -> None:
        now = time.perf_counter()
        row.times[name] = now - last[0]
        last[0] = now

    try:
        torch.manual_seed(0)
        model = builder(name, size)().eval()
        data = synthetic_batches(calib, batch, size)
        settle_batchnorm(model, data)
        lap(stage)
        stage = "quantize"
        trtqat.quantize(model, forward_loop=data)
        lap(stage)
        example = synthetic_batches(1, 2, size, seed=7)[0]
        val = synthetic_batches(2, 8, size, seed=11)
        for variant in dict.fromkeys((*variants, "int8")):  # int8: linted, built
            stage = f"export-{variant}"
            path = out / f"{name}-{size}-{variant}.onnx"
            result = trtqat.export_onnx(model, example, path, variant, validation_data=val)
            row.notes += [n for n in result.notes if n not in row.notes]
            lap(stage)
        stage = "lint"
        _lint(out / f"{name}-{size}-int8.onnx", row)
        stage = "engine"
        _engine(out / f"{name}-{size}-int8.onnx", data, row, threads, min_cosine)
        lap(stage)
    except Exception as exc:  # a sweep records the failure and goes on
        logging.getLogger("sweep").debug("%s failed", name, exc_info=True)
        row.stage, row.error = stage, _first_line(exc)
        if "--traceback" in sys.argv:
            traceback.print_exc()
    row.seconds = time.perf_counter() - t0
    return row


# ---------------------------------------------------------------- table
HEADER = (f"{'model':<24} {'px':>4} {'stage':<16} {'res-add':>7} {'float':>5} "
          f"{'int mm':>9} {'share':>6} {'s':>6}  other warnings / float conv-mm / error")


def format_row(r: Row) -> str:
    share = f"{r.integer / r.mm_total:6.1%}" if r.mm_total else "   -  "
    mm = f"{r.integer}/{r.mm_total}" if r.mm_total else "-"
    res = "-" if r.residual is None else str(r.residual)
    flt = "-" if r.float_layer is None else str(r.float_layer)
    bad = r.stage != "ok" or (r.residual or 0) or (r.float_layer or 0) or (
        r.mm_total and r.integer / r.mm_total < TARGET_INT_SHARE)
    tail = r.error or "; ".join([", ".join(f"{k} {v}" for k, v in r.other.items()),
                                 ", ".join(f"{k} {v}" for k, v in r.float_mm.items())]).strip("; ")
    return (f"{r.name:<24} {r.size:>4} {r.stage:<16} {res:>7} {flt:>5} {mm:>9} {share} "
            f"{r.seconds:6.1f}  {'FAIL ' if bad else ''}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="all",
                        help="comma-separated names (timm, user_*, torchvision) or 'all', "
                             "'timm', 'user', 'zoo', 'subclass'")
    parser.add_argument("--size", type=int, default=64,
                        help="image size (models with a fixed size use theirs)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="folder for the ONNX files (temporary)")
    parser.add_argument("--times", action="store_true",
                        help="print each model's seconds per stage and its export notes")
    parser.add_argument("--traceback", action="store_true", help="print failures' tracebacks")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="export variants to check (int8 is always exported)")
    parser.add_argument("--min-cosine", type=float, default=0.98,
                        help="the ORT engine's agreement floor (centered cosine)")
    args = parser.parse_args(argv)
    groups = {"all": all_models(), "timm": list(TIMM), "user": list(USER),
              "subclass": list(TIMM_SUBCLASS),
              "zoo": list(ZOO.values())}
    names = [n for item in args.models.split(",") for n in groups.get(item, [item])]
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.ERROR)
    print(HEADER, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtqat-sweep-") as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        for name in names:
            size = FIXED_SIZE.get(name, max(args.size, MIN_SIZE.get(name, 0)))
            row = run_model(name, size, out, args.threads,
                            variants=tuple(args.variants.split(",")),
                            min_cosine=args.min_cosine)
            rows.append(row)
            print(format_row(row), flush=True)
            if args.times:
                print("    " + ", ".join(f"{k} {v:.0f}s" for k, v in row.times.items())
                      + ("; notes: " + " | ".join(row.notes) if row.notes else ""), flush=True)
    bad = [r.name for r in rows if r.stage != "ok" or r.residual or r.float_layer or (
        r.mm_total and r.integer / r.mm_total < TARGET_INT_SHARE)]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} models meet the targets"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

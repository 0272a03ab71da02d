"""``demo``: the whole pipeline on the bundled digits data, end to end, for one or more models.

Per model: FP32 training -> PTQ with every calibrator -> QAT from the best PyTorch calibrator ->
export of every variant -> engines -> benchmark -> that model's comparison report; then one
report of every model (:mod:`trtqat.stages.demo_report`). PTQ and QAT run once per format of
``formats`` (INT8 by default; ``fp8,int8`` puts FP8 rows beside INT8's: ``ptq-max-fp8``,
``qat-fp8`` ...; :data:`FORMAT_CALIBRATORS` says which calibrators each format takes). By default ResNet18
(:data:`DEMO_MODELS`); MobileNetV2 on request: on digits the best PTQ calibrator keeps it at
FP32's top-1, while the entropy calibrator clips its ReLU6 outputs and loses tens of points,
which QAT recovers (``benchmarks/mobile_accuracy.py`` measures it over seeds; the README has
the figures). Stages whose results exist are reused. Training, calibration and
QAT run on ``device``; export runs on the CPU and the engines on ``backend``. Each model's
family (``trtqat.families.of_model``) runs its training stages, so any image-classifier
family works (CNNs, Vision Transformers).

Folders: ``runs/<model>/{fp32,ptq-*,qat}``, ``export_dir/<model>-*.onnx``,
``out/<model>/`` (engines and the model's own report) and ``out/report.{md,json,png}``.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtqat.engines.registry import DEFAULT_BACKEND
from trtqat.errors import TrtqatError
from trtqat.stages.compare.report import refuse_foreign_reports
from trtqat.stages.compare.result import CompareReport
from trtqat.stages.compare.run import CompareConfig, compare
from trtqat.stages.demo_models import DEMO_MODELS, DEMO_RUNS  # noqa: F401  (re-exported)
from trtqat.stages.demo_report import DemoReport, DemoSection, write_demo_report

# (method, percentile) of every PTQ baseline
CALIBRATORS: tuple[tuple[str, float | None], ...] = (
    ("max", None), ("percentile", 99.9), ("percentile", 99.99), ("mse", None), ("entropy", None))
# each format's PTQ baselines: entropy is INT8's (a KL search over an integer grid), INT4
# weights take max or mse per block
FORMAT_CALIBRATORS: dict[str, tuple[tuple[str, float | None], ...]] = {
    "int8": CALIBRATORS, "fp8": CALIBRATORS[:4], "int4": (("max", None), ("mse", None))}


@dataclass
class DemoConfig:
    """Options of ``trtqat demo``."""

    model: str | Sequence[str] | None = None  # one name, "a,b" or a list; None: DEMO_MODELS
    data: str = "digits"
    image_size: int | tuple[int, int] | None = None  # None: the family's (32; detectors 96)
    epochs: int | None = None  # None: the family's FP32 recipe (15 for CNNs, 30 for ViTs)
    calib_batches: int = 8
    qat_epochs: int | None = None
    runs: str = DEMO_RUNS
    export_dir: str = "export"
    out: str = "engines"
    backend: str = DEFAULT_BACKEND
    batch_sizes: tuple[int, ...] = (1, 32)
    duration_s: float = 1.0
    threads: int | None = None
    fresh: bool = False
    progress: bool = True
    device: str = "auto"
    formats: str | Sequence[str] = ("int8",)  # "fp8,int8" or a list: PTQ and QAT of each

    def __post_init__(self) -> None:
        from trtqat.formats import FORMATS
        from trtqat.sizes import hw

        names = self.formats.split(",") if isinstance(self.formats, str) else self.formats
        self.formats = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise TrtqatError(f"--format {','.join(unknown) or '(none)'}: give one or more of "
                              f"{', '.join(FORMATS)}, separated by commas (e.g. fp8,int8)")

        names = self.model.split(",") if isinstance(self.model, str) else self.model
        self.models: tuple[str, ...] = tuple(dict.fromkeys(
            n.strip() for n in (names or DEMO_MODELS) if n.strip()))
        if not self.models:
            raise TrtqatError("--model names no model: give one, e.g. --model resnet18, or "
                              "several separated by commas")
        if ((self.epochs is not None and self.epochs < 1) or self.calib_batches < 1
                or (self.image_size is not None and min(hw(self.image_size)) < 8)):
            raise TrtqatError("--epochs and --calib-batches must be >= 1 and --image-size >= 8")


def _stage_dir(root: Path, method: str, percentile: float | None, fmt: str = "int8") -> Path:
    name = f"ptq-{method}-{percentile:g}" if percentile is not None else f"ptq-{method}"
    return root / (name if fmt == "int8" else f"{name}-{fmt}")


def _qat_dir(root: Path, fmt: str) -> Path:
    return root / ("qat" if fmt == "int8" else f"qat-{fmt}")


def _done(run: Path) -> bool:
    return (run / "best.pt").is_file() and (run / "last.pt").is_file()


def _fp32_complete(run: Path, epochs: int) -> bool:
    if not _done(run):
        return False
    from trtqat.runs.checkpoint import load_checkpoint

    return int(load_checkpoint(run / "last.pt").get("epoch", -1)) + 1 >= epochs


def model_folder(family, model: str) -> str:
    """The file-name-safe folder of ``model`` under ``--runs`` and ``--out``."""
    from trtqat.variants import arch_label

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", arch_label(family.arch(model)))


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """PyTorch's CPU threads set to ``threads`` (the training stages') while the demo runs;
    None (or 0) leaves torch's default."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_demo(cfg: DemoConfig, echo: Callable[[str], None] = print) -> DemoReport:
    """Run (or resume) the demo pipeline of every model of ``cfg``; returns the demo's report
    (each model's comparison, and where the report of them all went)."""
    from trtqat import families
    from trtqat.runs.distributed import pick_device

    plan = [(model, families.of_model(model)) for model in cfg.models]
    for model, family in plan:  # every model checked before the first one trains
        if family.task not in ("classification", "detection"):
            raise TrtqatError(f"--model {model} is one of the "
                              f"{family.summary.split(':')[0]}: the demo trains image "
                              "classifiers and detectors (e.g. --model resnet18, --model "
                              "yolo_digits)")
        if hasattr(family, "origin"):
            family.origin(model)  # an unknown name: one line now, not after the others train
    folders = [model_folder(family, model) for model, family in plan]
    if len(set(folders)) < len(folders):
        raise TrtqatError(f"--model {','.join(cfg.models)} names one model twice")
    pick_device(cfg.device)  # refuse --device cuda without a GPU before any stage runs
    refuse_foreign_reports(cfg.out)  # not after an hour of training
    t_start = time.perf_counter()
    sections = []
    with _torch_threads(cfg.threads):
        for i, ((model, family), folder) in enumerate(zip(plan, folders), 1):
            echo(f"=== {model} ({i}/{len(plan)}) ===")
            t_model = time.perf_counter()
            report, top1 = _run_model(cfg, model, family, folder, echo)
            sections.append(DemoSection(model, folder, report, top1,
                                        time.perf_counter() - t_model))
    demo = write_demo_report(sections, cfg.out)
    echo("")
    echo(demo.glance)
    echo(f"demo report: {demo.files['md']}  {demo.files['json']}  {demo.files['png']}")
    echo(f"demo finished in {time.perf_counter() - t_start:.0f}s")
    return demo


def _run_model(cfg: DemoConfig, model: str, family, folder: str,
               echo: Callable[[str], None]) -> tuple[CompareReport, dict[str, float]]:
    """The four stages of one model: its comparison report and the PyTorch top-1 of each
    training stage (the best epoch's, as the run folders record it)."""
    from trtqat.runs.checkpoint import load_checkpoint
    from trtqat.sizes import size_text
    from trtqat.stages.train import TrainConfig

    root = Path(cfg.runs) / folder
    fp32 = root / "fp32"
    common = {"progress": cfg.progress, "device": cfg.device}  # the training stages' device
    train_cfg = TrainConfig(model=model, data=cfg.data, image_size=cfg.image_size,
                            epochs=cfg.epochs, out=str(fp32), **common)

    echo(f"[1/4] FP32 training: {model} on {cfg.data} at {size_text(train_cfg.image_size)}, "
         f"{train_cfg.epochs} epochs -> {fp32}")
    if not cfg.fresh and _fp32_complete(fp32, train_cfg.epochs):
        echo("      reusing the finished run (--fresh to redo)")
    else:
        resume = not cfg.fresh and (fp32 / "last.pt").is_file()
        train_cfg.resume, train_cfg.overwrite = resume, not resume
        family.run_train(train_cfg)
    source = load_checkpoint(fp32 / "best.pt")
    top1 = {"fp32": float(source.get(family.score_key, -1))}

    for fmt in cfg.formats:
        top1.update(_ptq_and_qat(cfg, family, root, fmt, source, common, echo))

    out_dir = Path(cfg.out) / folder
    echo(f"[4/4] export every variant to {cfg.export_dir}/, build {cfg.backend} engines, "
         f"benchmark and compare -> {out_dir}/")
    report = compare(CompareConfig(run=str(root), backend=cfg.backend,
                                   batch_sizes=cfg.batch_sizes, export_dir=cfg.export_dir,
                                   out=str(out_dir), duration_s=cfg.duration_s,
                                   threads=cfg.threads, fresh=cfg.fresh,
                                   progress=cfg.progress), echo=echo)
    return report, top1


def _ptq_and_qat(cfg: DemoConfig, family, root: Path, fmt: str, source: dict,
                 common: dict, echo: Callable[[str], None]) -> dict[str, float]:
    """PTQ of one format with each of its calibrators, then QAT from the best of them:
    the PyTorch top-1 of each run (``ptq-<method>[-<format>]``, ``qat-<format>``)."""
    from trtqat.families.types import StageResult
    from trtqat.runs.checkpoint import load_checkpoint
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.qat import QATConfig

    calibrators = FORMAT_CALIBRATORS[fmt]
    fp32, name = root / "fp32", fmt.upper()
    echo(f"[2/4] PTQ {name}: {len(calibrators)} calibrators on {cfg.calib_batches} batches "
         "each")
    top1: dict[str, float] = {}
    for method, pct in calibrators:
        out = _stage_dir(root, method, pct, fmt)
        label = f"{method} {pct:g}" if pct is not None else method
        if not cfg.fresh and _done(out):
            top1[out.name] = float(load_checkpoint(out / "best.pt").get(family.score_key, -1))
            echo(f"      {label}: reusing {out} ({family.score_label} {top1[out.name]:.2f})")
            continue
        res = StageResult.of("calibrate", family.run_calibrate(CalibrateConfig(
            checkpoint=str(fp32 / "best.pt"), out=str(out), method=method,
            percentile=pct or 99.99, num_batches=cfg.calib_batches, overwrite=True,
            **({} if fmt == "int8" else {"format": fmt}), **common), source))
        top1[out.name] = -1.0 if res.best is None else res.best
        echo(f"      {label}: {family.score_label} {top1[out.name]:.2f}")

    best_ptq = root / max(top1, key=top1.get)
    qat = _qat_dir(root, fmt)
    echo(f"[3/4] QAT {name} fine-tuning from the QAT start, the best PyTorch calibrator "
         f"({best_ptq.name}) -> {qat}")
    if not cfg.fresh and _done(qat):
        echo("      reusing the finished run (--fresh to redo)")
    else:
        family.run_qat(QATConfig(checkpoint=str(best_ptq / "best.pt"), out=str(qat),
                                 epochs=cfg.qat_epochs, overwrite=True, **common),
                       load_checkpoint(best_ptq / "best.pt"))
    top1[f"qat-{fmt}"] = float(load_checkpoint(qat / "best.pt").get(family.score_key, -1))
    return top1

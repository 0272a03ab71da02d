"""``demo``: the whole pipeline on the bundled digits data, end to end.

FP32 training -> PTQ with every calibrator -> QAT from the best PTQ model -> export of every
variant -> engines -> benchmark -> report. Stages whose results exist are reused. Training,
calibration and QAT run on ``device``; export runs on the CPU and the engines on ``backend``.
The model's family (``trtqat.families.of_model``) is found once and runs every training
stage, so any image-classifier family works (CNNs, Vision Transformers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtqat.engines.registry import DEFAULT_BACKEND
from trtqat.errors import TrtqatError
from trtqat.stages.compare.result import CompareReport
from trtqat.stages.compare.run import CompareConfig, compare

# (method, percentile) of every PTQ baseline
CALIBRATORS: tuple[tuple[str, float | None], ...] = (
    ("max", None), ("percentile", 99.9), ("percentile", 99.99), ("mse", None), ("entropy", None))


@dataclass
class DemoConfig:
    """Options of ``trtqat demo``."""

    model: str = "resnet18"
    data: str = "digits"
    image_size: int | tuple[int, int] = 32
    epochs: int | None = None  # None: the family's FP32 recipe (15 for CNNs, 30 for ViTs)
    calib_batches: int = 8
    qat_epochs: int | None = None
    runs: str = "runs/demo"
    export_dir: str = "export"
    out: str = "engines"
    backend: str = DEFAULT_BACKEND
    batch_sizes: tuple[int, ...] = (1, 32)
    duration_s: float = 1.0
    threads: int | None = None
    fresh: bool = False
    progress: bool = True
    device: str = "auto"

    def __post_init__(self) -> None:
        from trtqat.sizes import hw

        if ((self.epochs is not None and self.epochs < 1) or self.calib_batches < 1
                or min(hw(self.image_size)) < 8):
            raise TrtqatError("--epochs and --calib-batches must be >= 1 and --image-size >= 8")


def _stage_dir(root: Path, method: str, percentile: float | None) -> Path:
    return root / (f"ptq-{method}-{percentile:g}" if percentile is not None else f"ptq-{method}")


def _done(run: Path) -> bool:
    return (run / "best.pt").is_file() and (run / "last.pt").is_file()


def _fp32_complete(run: Path, epochs: int) -> bool:
    if not _done(run):
        return False
    from trtqat.runs.checkpoint import load_checkpoint

    return int(load_checkpoint(run / "last.pt").get("epoch", -1)) + 1 >= epochs


def run_demo(cfg: DemoConfig, echo: Callable[[str], None] = print) -> CompareReport:
    """Run (or resume) the demo pipeline; returns the comparison report."""
    from trtqat import families
    from trtqat.families.types import StageResult
    from trtqat.runs.checkpoint import load_checkpoint
    from trtqat.runs.distributed import pick_device
    from trtqat.sizes import size_text
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.qat import QATConfig
    from trtqat.stages.train import TrainConfig

    family = families.of_model(cfg.model)
    if family.task != "classification":
        raise TrtqatError(f"--model {cfg.model} is one of the {family.summary.split(':')[0]}: "
                          "the demo trains image classifiers (e.g. --model resnet18)")
    pick_device(cfg.device)  # refuse --device cuda without a GPU before any stage runs
    t_start = time.perf_counter()
    root = Path(cfg.runs)
    fp32 = root / "fp32"
    common = {"progress": cfg.progress, "device": cfg.device}  # the training stages' device
    train_cfg = TrainConfig(model=cfg.model, data=cfg.data, image_size=cfg.image_size,
                            epochs=cfg.epochs, out=str(fp32), **common)

    echo(f"[1/4] FP32 training: {cfg.model} on {cfg.data} at {size_text(cfg.image_size)}, "
         f"{train_cfg.epochs} epochs -> {fp32}")
    if not cfg.fresh and _fp32_complete(fp32, train_cfg.epochs):
        echo("      reusing the finished run (--fresh to redo)")
    else:
        resume = not cfg.fresh and (fp32 / "last.pt").is_file()
        train_cfg.resume, train_cfg.overwrite = resume, not resume
        family.run_train(train_cfg)

    echo(f"[2/4] PTQ: {len(CALIBRATORS)} calibrators on {cfg.calib_batches} batches each")
    ptq_results: dict[Path, float] = {}
    source = load_checkpoint(fp32 / "best.pt")
    for method, pct in CALIBRATORS:
        out = _stage_dir(root, method, pct)
        label = f"{method} {pct:g}" if pct is not None else method
        if not cfg.fresh and _done(out):
            ptq_results[out] = float(load_checkpoint(out / "best.pt").get("best_top1", -1))
            echo(f"      {label}: reusing {out} (top-1 {ptq_results[out]:.2f}%)")
            continue
        res = StageResult.of("calibrate", family.run_calibrate(CalibrateConfig(
            checkpoint=str(fp32 / "best.pt"), out=str(out), method=method,
            percentile=pct or 99.99, num_batches=cfg.calib_batches, overwrite=True, **common),
            source))
        ptq_results[out] = -1.0 if res.best is None else res.best
        echo(f"      {label}: top-1 {ptq_results[out]:.2f}%")

    best_ptq = max(ptq_results, key=ptq_results.get)
    qat = root / "qat"
    echo(f"[3/4] QAT fine-tuning from the best PTQ model ({best_ptq.name}) -> {qat}")
    if not cfg.fresh and _done(qat):
        echo("      reusing the finished run (--fresh to redo)")
    else:
        family.run_qat(QATConfig(checkpoint=str(best_ptq / "best.pt"), out=str(qat),
                                 epochs=cfg.qat_epochs, overwrite=True, **common),
                       load_checkpoint(best_ptq / "best.pt"))

    echo(f"[4/4] export every variant to {cfg.export_dir}/, build {cfg.backend} engines, "
         f"benchmark and compare -> {cfg.out}/")
    report = compare(CompareConfig(run=str(root), backend=cfg.backend,
                                   batch_sizes=cfg.batch_sizes, export_dir=cfg.export_dir,
                                   out=cfg.out, duration_s=cfg.duration_s, threads=cfg.threads,
                                   fresh=cfg.fresh, progress=cfg.progress), echo=echo)
    echo(f"demo finished in {time.perf_counter() - t_start:.0f}s")
    return report

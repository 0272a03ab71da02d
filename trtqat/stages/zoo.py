"""The torchvision classification zoo through PTQ: calibrate (max), INT8 export with every
check, the Q/DQ lint, and an ONNX Runtime engine that runs.

Models have random weights (``weights=None``); their BatchNorm statistics are settled on
the same synthetic images the calibration uses, so activations have realistic ranges.
Used by ``tests/zoo`` (small sizes) and ``benchmarks/zoo.py`` (usual sizes, with timings).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)

# family -> the member benchmarks/zoo.py runs (the one the issue names), at USUAL_SIZE px
ZOO: dict[str, str] = {
    "resnet": "resnet50", "mobilenet_v2": "mobilenet_v2", "mobilenet_v3": "mobilenet_v3_small",
    "efficientnet": "efficientnet_b0", "regnet": "regnet_y_400mf", "convnext": "convnext_tiny",
    "shufflenet": "shufflenet_v2_x1_0", "densenet": "densenet121", "vgg": "vgg11_bn",
    "squeezenet": "squeezenet1_1", "vit": "vit_b_16", "swin": "swin_t",
}
USUAL_SIZE = 224


@dataclass
class ZooResult:
    """How one model went through the PTQ path."""

    name: str
    image_size: int
    status: str = "ok"  # ok | failed
    stage: str = ""  # the stage that failed: build, calibrate, export, lint, engine
    error: str = ""
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    onnx: str = ""
    engine: Any = None  # the ORT engine (not serialised)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (the engine left out)."""
        return {k: v for k, v in self.__dict__.items() if k != "engine"}


def synthetic_batches(n: int, batch: int, size: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` reproducible N(0, 1) image batches."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, size, size, generator=gen) for _ in range(n)]


@torch.no_grad()
def settle_batchnorm(model: nn.Module, data: list[torch.Tensor]) -> None:
    """BatchNorm running statistics from ``data`` with quantizers off, and random values in
    all-zero weight matrices, as after training."""
    from trtqat.quant.model_ops import disable_quantization, enable_quantization

    disable_quantization(model)
    for p in model.parameters():  # zero-initialised heads (ViT) are nonzero once trained
        if p.dim() > 1 and not bool(p.any()):
            nn.init.normal_(p, std=0.02)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the batches
    model.train()
    for x in data:
        model(x)
    model.eval()
    enable_quantization(model)


def quantized_model(name: str, num_classes: int = 10) -> nn.Module:
    """A random-weight quantized torchvision model with max calibrators everywhere."""
    from trtqat.families.cnn.models import build_model
    from trtqat.quant.descriptor import QuantDescriptor

    return build_model(name, num_classes, quantized=True,
                       quant_desc_input=QuantDescriptor(num_bits=8))


def quantize_model(model: nn.Module) -> nn.Module:
    """Quantize an already built model as :func:`quantized_model` does (max calibrators,
    the CLI's Q/DQ placement), in place."""
    from trtqat.families.cnn.models import quantize_classifier
    from trtqat.quant.descriptor import QuantDescriptor

    quantize_classifier(model, quant_desc_input=QuantDescriptor(num_bits=8))
    return model


def run_ptq(name: str, image_size: int, out_dir: str | Path, *,
            model: nn.Module | None = None, calib_batches: int = 2, batch: int = 4,
            val_batches: int = 2, seed: int = 0,
            engine_threads: int | None = None) -> ZooResult:
    """Calibrate (max), export INT8 with its checks, lint, build and run an ORT engine.

    ``model`` overrides the torchvision model of ``name`` (a smaller configuration of the
    same classes, for tests). Never raises for a model failure: the result says which stage
    failed and why.
    """
    from trtqat.quant.model_ops import collect_stats, compute_amax

    result = ZooResult(name, image_size)
    t0 = time.perf_counter()
    stage = "build"
    try:
        torch.manual_seed(seed)
        model = model if model is not None else quantized_model(name)
        data = synthetic_batches(calib_batches, batch, image_size, seed)
        stage = "calibrate"
        settle_batchnorm(model, data)
        collect_stats(model, data, progress=False)
        compute_amax(model, "max")
        stage = "export"
        path = _export(model, name, image_size, Path(out_dir), result, val_batches, seed)
        stage = "engine"
        result.engine = _engine(path, data, engine_threads, result)
    except Exception as exc:  # a sweep records each model's failure and goes on
        log.debug("%s failed at %s", name, stage, exc_info=True)
        result.status, result.stage = "failed", stage
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    result.seconds = time.perf_counter() - t0
    return result


def _export(model: nn.Module, name: str, size: int, out: Path, result: ZooResult,
            val_batches: int, seed: int) -> Path:
    from trtqat.export import Exporter, ValidationError
    from trtqat.variants import artifact_name

    val = [(x,) for x in synthetic_batches(val_batches, 32, size, seed + 1)]
    exporter = Exporter(model, synthetic_batches(1, 2, size, seed + 2)[0],
                        validation_data=val)
    path = out / artifact_name(f"{name}_{size}", "ptq-max", "int8")  # e.g. resnet18_224-ptq-max-int8
    try:
        export = exporter.export(path, "int8", 17)
    except ValidationError as exc:
        result.checks = exc.result.lines()
        result.notes = list(exc.result.notes)
        raise
    result.checks, result.notes, result.onnx = export.lines(), list(export.notes), str(path)
    return path


def _engine(path: Path, data: list[torch.Tensor], threads: int | None, result: ZooResult):
    """An ORT engine of ``path`` (CPU re-encoding calibrated on ``data``), run once."""
    from trtqat.engines import build_engine

    feeds = [{"input": x.numpy()} for x in data]
    # the agreement of the re-encoding is reported, not enforced, for random-weight models
    engine = build_engine(path, "ort", threads=threads, calib_feeds=feeds, min_top1=0.0)
    with engine.runner(threads=threads) as runner:
        out = next(iter(runner.infer(feeds[0]).values()))
    if not np.isfinite(out).all():
        raise RuntimeError("the ORT engine produced non-finite outputs")
    return engine


def format_results(results: list[ZooResult], extra: Callable[[ZooResult], str] | None = None
                   ) -> str:
    """One line per model: status, the failed stage and error, or the notes."""
    lines = []
    for r in results:
        tail = r.error if r.status != "ok" else "; ".join(r.notes)
        more = extra(r) if extra else ""
        lines.append(f"{r.name:<20} {r.image_size:>4}px  {r.status:<6} {r.stage:<9} "
                     f"{r.seconds:6.1f}s  {more}{tail}")
    return "\n".join(lines)

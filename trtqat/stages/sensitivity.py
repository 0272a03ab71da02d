"""Layer sensitivity: which quantized layers cost the accuracy, and which to leave in float.

``sensitivity(SensitivityConfig(checkpoint=...))`` evaluates a calibrated (ptq/qat) checkpoint
on a few validation batches held in memory with one layer switched at a time:

- ``one-on``: only that layer quantized; its effect is the harm against the FP32 model.
- ``one-off``: every layer but that one quantized; its effect is what leaving it in float
  recovers against the fully quantized model.

A *layer* is a module owning quantizers: a Quant* layer with its input and weight
quantizers (``layer1.0.conv1``), or a standalone quantizer such as a ResNet block's
``layer1.0.residual_quantizer``. Quantizers the checkpoint already leaves in float
(``--skip-layers`` at calibration) stay disabled throughout.

Speed: the model is traced with torch.fx (layers as leaves); per batch the base
configuration runs once with every intermediate value kept, and for each layer only the
nodes downstream of it run again. Quantized weights are fake-quantized once. If tracing
fails, every configuration runs as a full forward pass (same numbers, slower).
"""

from __future__ import annotations

import time
from pathlib import Path

from trtqat.stages.sensitivity_report import (
    load_for_sensitivity,
    refuse_foreign_outputs,
    suggest,
    write_outputs,
)
from trtqat.stages.sensitivity_sweep import (
    METRICS,
    MODES,
    SensitivityConfig,
    SensitivityError,
    SensitivityResult,
    make_runner,
    rank,
    run_sweep,
)

__all__ = ["METRICS", "MODES", "SensitivityConfig", "SensitivityError", "SensitivityResult",
           "default_out", "sensitivity"]


def default_out(checkpoint: str | Path) -> Path:
    """``<the checkpoint's run folder>/sensitivity``."""
    path = Path(checkpoint)
    return (path if path.is_dir() else path.parent) / "sensitivity"


def sensitivity(cfg: SensitivityConfig) -> SensitivityResult:
    """Run the sweep, write ``sensitivity.json`` and ``sensitivity.png``; see module doc."""
    from trtqat.threads import apply_threads

    apply_threads(cfg.threads)
    out = Path(cfg.out) if cfg.out else default_out(cfg.checkpoint)
    refuse_foreign_outputs(out)  # before the sweep, not after it
    model, units, batches, info, family = load_for_sensitivity(cfg)
    t0 = time.perf_counter()
    runner = make_runner(model, units, cfg.cache,
                         cfg.metric_output or info.get("metric_output"))
    baselines, per_layer = run_sweep(runner, units, cfg.mode, batches, cfg.progress, family)
    rows = rank(per_layer, units, baselines, cfg.mode, cfg.metric)
    elapsed = time.perf_counter() - t0
    result = SensitivityResult(
        config={**info, "mode": cfg.mode, "metric": cfg.metric, "layers": len(units)},
        baselines=baselines, rows=rows, time_s=elapsed, engine=runner.engine,
        images=sum(int(y.shape[0]) for _, y in batches))
    if cfg.suggest:
        result.suggestion = suggest(runner, units, batches, rows, cfg, info, family)
    write_outputs(result, out)
    return result

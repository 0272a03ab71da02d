"""Loading, suggestion and outputs of the sensitivity sweep (``sensitivity.json``/``.png``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from trtqat.atomic import write_atomic, write_json
from trtqat.errors import TrtqatError
from trtqat.quant.tensor_quantizer import TensorQuantizer
from trtqat.stages.sensitivity_sweep import (
    SensitivityConfig,
    SensitivityError,
    SensitivityResult,
    evaluate_configs,
    layer_units,
)
from trtqat.tables import text_table

log = logging.getLogger(__name__)

PLOT_LAYERS = 30


def _device(name: str) -> torch.device:
    from trtqat.runs.distributed import pick_device

    try:
        return pick_device(name)  # also refuses --device cuda without a GPU
    except TrtqatError as exc:
        raise SensitivityError(str(exc)) from None


def load_for_sensitivity(cfg: SensitivityConfig):
    """(model, layers, validation batches in memory, info, family) for ``cfg``; checks the
    checkpoint. The checkpoint's family loads the model, its data and scores it."""
    from trtqat import families
    from trtqat.families.base import UnsupportedStageError
    from trtqat.finite import check_finite_arrays
    from trtqat.runs.checkpoint import load_checkpoint

    ckpt = load_checkpoint(cfg.checkpoint)
    check_finite_arrays(ckpt["state_dict"].items(), f"checkpoint {cfg.checkpoint}",
                        "nothing analysed; calibrate a finite checkpoint")
    family = families.of_checkpoint(ckpt)
    spec, stage = ckpt["model"], str(ckpt.get("stage", "fp32"))
    if not spec.get("quantized"):
        raise SensitivityError(
            f"{cfg.checkpoint} is a {stage} checkpoint without quantizers, so there is "
            f"nothing to analyse: run `trtqat calibrate --checkpoint {cfg.checkpoint}` first "
            "and pass its best.pt")
    device = _device(cfg.device)
    try:
        batches, info = family.sensitivity_data(ckpt, cfg, device)
    except UnsupportedStageError as exc:
        raise SensitivityError(f"{cfg.checkpoint}: {exc}") from None
    model = family.load(ckpt).to(device).eval()
    units = layer_units(model)
    if not units:
        raise SensitivityError(f"{cfg.checkpoint}: every quantizer is disabled (skip_layers "
                               f"{spec.get('skip_layers')}); there is no quantized layer left")
    missing = [q._name for qs in units.values() for q in qs if q.amax is None]
    if missing:
        raise SensitivityError(f"{cfg.checkpoint}: quantizer {missing[0]} has no amax; "
                               "calibrate the model first (trtqat calibrate)")
    calib = ckpt.get("calib") or {}
    info = {"checkpoint": str(cfg.checkpoint), "stage": stage, "arch": spec["arch"], **info,
            "batches": len(batches), "skip_layers": list(spec.get("skip_layers") or []),
            "fp32_checkpoint": calib.get("source"), "calib_method": calib.get("method"),
            "calib_percentile": calib.get("percentile"), "device": str(device),
            "metric_output": spec.get("metric_output")}
    return model, units, batches, info, family




def suggest(runner, units: dict[str, list[TensorQuantizer]], batches: list, rows: list[dict],
            cfg: SensitivityConfig, info: dict[str, Any], family=None) -> dict[str, Any]:
    """The ``cfg.suggest`` top-ranked layers, evaluated left in float, with the commands."""
    chosen = [r["layer"] for r in rows[: cfg.suggest]]
    everything = frozenset(units)
    with torch.inference_mode():
        refs = [runner.logits(frozenset(), x).float() for x, _ in batches]
    metrics = evaluate_configs(runner, batches, refs, [everything - set(chosen)], family)[0]
    runner.restore()
    skip = list(dict.fromkeys([*info["skip_layers"], *chosen]))
    return {"layers": chosen, "skip_layers": skip, "metrics": metrics,
            "commands": commands(info, skip, len(chosen))}


def commands(info: dict[str, Any], skip: list[str], k: int) -> list[str]:
    """Ready-to-run command lines that leave ``skip`` in float."""
    this = Path(info["checkpoint"])
    run = this if this.is_dir() else this.parent
    fp32 = info.get("fp32_checkpoint") or "<the FP32 best.pt of `trtqat train`>"
    layers = ",".join(skip)
    method = info.get("calib_method")  # recalibrate as the analysed checkpoint was
    how = f" --method {method}" if method else ""
    if method == "percentile" and info.get("calib_percentile") is not None:
        how += f" --percentile {info['calib_percentile']}"
    return [
        f"trtqat calibrate --checkpoint {fp32}{how} --skip-layers {layers} --out {run}-skip{k}",
        f"trtqat qat --checkpoint {this} --skip-layers {layers} --out {run.parent}/qat-skip{k}",
        f"trtqat export --checkpoint {this} --skip-layers {layers} --variant int8 "
        f"--out export/skip{k}",
    ]


# --------------------------------------------------------------------------- outputs
def plot(result: SensitivityResult, path: Path) -> None:
    """sensitivity.png: a horizontal bar chart of the most sensitive layers."""
    from trtqat.optional import require

    require("matplotlib", "report", "the sensitivity chart").use("Agg")
    import matplotlib.pyplot as plt

    rows = result.rows[:PLOT_LAYERS]
    mode, metric = result.config["mode"], result.config["metric"]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.28 * max(len(rows), 1)))
    effects = [r["effect"] for r in rows]
    colors = ["tab:red" if e > 0 else "tab:gray" for e in effects]
    ax.barh([r["layer"] for r in rows], effects, color=colors)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    what = ("harm when only this layer is quantized" if mode == "one-on"
            else "recovered when only this layer stays float")
    unit = " (points)" if metric == "top1" else ""
    ax.set_xlabel(f"{metric} {what}{unit}")
    b = result.baselines
    ax.set_title(f"trtqat sensitivity ({mode}, {result.config['arch']}): fp32 top-1 "
                 f"{b['fp32']['top1']:.2f}%, quantized {b['quantized']['top1']:.2f}%",
                 fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def refuse_foreign_outputs(out: Path) -> None:
    """Refuse an ``out`` whose sensitivity.json/png are not earlier sensitivity outputs."""
    from trtqat.atomic import PNG, json_with_keys, refuse_foreign

    refuse_foreign(out / "sensitivity.json", json_with_keys("config", "baselines", "rows"),
                   "an earlier sensitivity report", "--out")
    refuse_foreign(out / "sensitivity.png", PNG, "an earlier sensitivity chart", "--out")


def write_outputs(result: SensitivityResult, out: Path) -> None:
    """Write sensitivity.json and sensitivity.png into ``out`` (each atomically)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SensitivityError(f"cannot create output folder {out}: {exc.strerror or exc}"
                               ) from None
    paths = {"json": out / "sensitivity.json", "png": out / "sensitivity.png"}
    write_json(paths["json"], result.to_dict())
    plot(result, paths["png"])
    result.paths = {k: str(v) for k, v in paths.items()}


def format_table(result: SensitivityResult, top: int = 10) -> str:
    """Baselines, then the ``top`` most sensitive layers, as ``trtqat sensitivity`` prints."""
    b, c = result.baselines, result.config
    head = (f"baselines on {result.images} images: fp32 top-1 {b['fp32']['top1']:.2f}% "
            f"loss {b['fp32']['loss']:.4f} | quantized top-1 {b['quantized']['top1']:.2f}% "
            f"loss {b['quantized']['loss']:.4f} output-mse {b['quantized']['output_mse']:.4g}")
    sign = "harm" if c["mode"] == "one-on" else "recovery"
    header = ["rank", "layer", f"{c['metric']} {sign}", "top1", "loss", "output-mse"]
    body = [[str(r["rank"]), r["layer"], f"{r['effect']:+.4g}", f"{r['top1']:.2f}",
             f"{r['loss']:.4f}", f"{r['output_mse']:.4g}"] for r in result.rows[:top]]
    return "\n".join([head, text_table(header, body)])


def format_suggestion(result: SensitivityResult) -> str:
    """The suggested layers, their measured effect, and the commands to apply them."""
    s = result.suggestion
    if not s:
        return ""
    m, q = s["metrics"], result.baselines["quantized"]
    lines = [f"suggest: leave {', '.join(s['layers'])} in float -> top-1 {m['top1']:.2f}% "
             f"(quantized {q['top1']:.2f}%, fp32 {result.baselines['fp32']['top1']:.2f}%), "
             f"loss {m['loss']:.4f}, output-mse {m['output_mse']:.4g}",
             "apply with one of:"]
    return "\n".join(lines + [f"  {c}" for c in s["commands"]])


__all__ = ["commands", "format_suggestion", "format_table", "load_for_sensitivity", "plot",
           "suggest", "write_outputs"]

"""report.png: one row of panels per model, every variant on its own line.

Each row holds the metric (top-1, or cosine for encoders) and the speed at each batch size
(median latency at the first, throughput at the others, with the min-max over the timing
rounds as error bars). Variants are the rows of every panel, in the report's order, so a
label can never land on another one, however close their figures are (INT8 variants of one
model usually sit at one point of an accuracy-latency scatter); each dot carries its value
and, beside FP32's dashed line, its difference to FP32. Colours say what a variant is: FP32
and FP16 float, PTQ INT8, QAT INT8.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtqat.atomic import write_atomic

ENCODER_METRIC = "mean_cosine"
KIND_COLORS = {"float": "tab:gray", "fp16": "tab:orange", "ptq": "tab:blue",
               "qat": "tab:green"}
KIND_NAMES = {"float": "FP32", "fp16": "FP16", "ptq": "PTQ INT8", "qat": "QAT INT8"}


def variant_kind(v: dict[str, Any]) -> str:
    """``float`` / ``fp16`` / ``ptq`` / ``qat``: the colour group of a report variant."""
    if v["name"].startswith("qat"):
        return "qat"
    if "int8" in v["precision"]:
        return "ptq"
    return "fp16" if "fp16" in v["precision"] else "float"


def variant_label(v: dict[str, Any]) -> str:
    """The variant's name with its marks: emulated, check failed, failed."""
    tags = (" (emulated)" if v.get("emulated") else "") + \
        (" [check failed]" if v.get("failed_checks") else "") + \
        (" FAILED" if v.get("status") != "ok" else "")
    return v["name"] + tags


def _rounds(v: dict[str, Any], key: str, batch: int, value: float) -> tuple[float, float]:
    """``(below, above)``: the min-max of a median over its timing rounds."""
    per_round = ((v.get("rounds") or {}).get(str(batch)) or {}).get(key) or [value]
    return max(value - min(per_round), 0.0), max(max(per_round) - value, 0.0)


def _columns(report: dict[str, Any]) -> list[tuple[str, int | None]]:
    """``(what, batch)`` of each panel of a row: the metric, then latency at the first batch
    size and throughput at every other one."""
    bs = list(report["batch_sizes"])
    return [("metric", None), ("latency_ms", bs[0]), *(("throughput", b) for b in bs[1:])]


def _values(report: dict[str, Any], what: str, batch: int | None
            ) -> list[tuple[float, float, float] | None]:
    """Per variant ``(value, below, above)`` of a panel, None where there is none."""
    out: list[tuple[float, float, float] | None] = []
    for v in report["variants"]:
        if v.get("status") != "ok":
            out.append(None)
            continue
        if what == "metric":
            x = (v.get("metrics") or {}).get(report["metric"])
            out.append(None if x is None else (float(x), 0.0, 0.0))
            continue
        x = (v.get(what) or {}).get(str(batch))
        out.append(None if x is None else (float(x), *_rounds(v, what, batch, float(x))))
    return out


def _text(report: dict[str, Any], what: str, value: float, ref: float | None) -> str:
    """A dot's value, and its difference (metric) or speed-up (timing) to FP32 ``ref``."""
    if what == "metric":
        if report["metric"] == ENCODER_METRIC:
            return f"{value:.5f}"
        return f"{value:.2f}" + ("" if ref is None else f" ({value - ref:+.2f})")
    unit = "ms" if what == "latency_ms" else "/s"
    text = f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    if ref:
        text += f" ({ref / value if what == 'latency_ms' else value / ref:.2f}x)"
    return text


def _title(report: dict[str, Any], what: str, batch: int | None) -> str:
    if what == "metric":
        metric = report["metric"]
        return "cosine vs FP32 (held-out)" if metric == ENCODER_METRIC else f"{metric} (%)"
    unit = "sentences" if report["metric"] == ENCODER_METRIC else "images"
    if what == "latency_ms":
        return f"latency, batch {batch} (ms, log)"
    return f"throughput, batch {batch} ({unit}/s, log)"


def _room(ax: Any, low: float, high: float, log: bool, min_span: float) -> None:
    """x limits that leave the data 70% of the panel, the labels the last 25%."""
    f = math.log if log else float
    g = math.exp if log else float
    a, b = f(low), f(high)
    total = max(b - a, f(1.5) if log else min_span) / 0.7
    ax.set_xlim(g(a - 0.05 * total), g(b + 0.25 * total))


def _panel(ax: Any, report: dict[str, Any], what: str, batch: int | None) -> None:
    """One panel: a dot per variant on its own line, the value written beside it."""
    values = _values(report, what, batch)
    names = [v["name"] for v in report["variants"]]
    ref_i = names.index("fp32") if "fp32" in names else None
    ref = values[ref_i][0] if ref_i is not None and values[ref_i] else None
    shown = [x for x in values if x is not None and math.isfinite(x[0]) and x[0] > 0]
    for y, (v, x) in enumerate(zip(report["variants"], values)):
        if x is None or not math.isfinite(x[0]):
            continue
        color = KIND_COLORS[variant_kind(v)]
        face = "white" if v.get("emulated") or v.get("failed_checks") else color
        ax.errorbar(x[0], y, xerr=[[x[1]], [x[2]]], fmt="o", color=color, mfc=face,
                    ecolor=color, capsize=3, ms=7)
        is_ref = v["name"] == "fp32"
        ax.annotate(_text(report, what, x[0], None if is_ref else ref), (x[0], y), textcoords="offset points",
                    xytext=(8, 0), va="center", fontsize=8)
    if ref is not None:
        ax.axvline(ref, color=KIND_COLORS["float"], ls="--", lw=1)
    if shown:
        log = what != "metric"
        low = min(x[0] - x[1] for x in shown)
        high = max(x[0] + x[2] for x in shown)
        if log:
            ax.set_xscale("log")
            low = max(low, 1e-9)
        _room(ax, low, high, log, 1e-3 if report["metric"] == ENCODER_METRIC else 0.5)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_yticks(range(len(names)))
    ax.set_title(_title(report, what, batch), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(labelsize=8)


def build_figure(sections: Sequence[tuple[str, dict[str, Any]]], title: str = "") -> Any:
    """The figure of ``sections`` (``(heading, report.json document)``): a row of panels
    per report, the variants' names on the left of each row."""
    from trtqat.optional import require

    require("matplotlib", "report", "the report chart").use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    cols = max(len(_columns(r)) for _, r in sections)
    heights = [max(len(r["variants"]), 1) * 0.32 + 1.1 for _, r in sections]
    height = sum(heights) + 0.5
    fig, axes = plt.subplots(len(sections), cols, figsize=(5.2 * cols + 1.2, height),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    for row, (heading, report) in enumerate(sections):
        columns = _columns(report)
        for col, ax in enumerate(axes[row]):
            if col >= len(columns):
                ax.set_visible(False)
                continue
            _panel(ax, report, *columns[col])
            labels = [variant_label(v) for v in report["variants"]] if col == 0 else []
            ax.set_yticklabels(labels)
        axes[row][0].set_ylabel(heading, fontsize=10, fontweight="bold")
    kinds = [k for k in KIND_COLORS if any(variant_kind(v) == k for _, r in sections
                                           for v in r["variants"])]
    handles = [Line2D([], [], marker="o", ls="", color=KIND_COLORS[k], label=KIND_NAMES[k])
               for k in kinds]
    handles.append(Line2D([], [], ls="--", color=KIND_COLORS["float"], label="FP32 reference"))
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height))
    return fig


def plot_reports(sections: Sequence[tuple[str, dict[str, Any]]], path: Path,
                 title: str = "") -> None:
    """Write the figure of ``sections`` (see :func:`build_figure`) to ``path`` (PNG)."""
    fig = build_figure(sections, title)
    import matplotlib.pyplot as plt

    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def plot_report(report: dict[str, Any], path: Path) -> None:
    """report.png of one comparison (one row)."""
    settings = report.get("settings") or {}
    plot_reports([(str(settings.get("model") or settings.get("run") or "model"), report)], path,
                 f"trtqat compare: {report['backend']} on {report['machine']['cpu']}")

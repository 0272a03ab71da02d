"""The comparison report: a terminal table, report.md, report.json and report.png."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtqat.atomic import write_atomic, write_json
from trtqat.stages.compare.plot import ENCODER_METRIC, plot_report  # noqa: F401 (re-exported)
from trtqat.tables import markdown_table, text_table

UNSTABLE_SPREAD = 0.10  # a timing figure whose spread exceeds this is flagged
# the key (and kind) of every report.json trtqat writes: compare and demo replace each other's
REPORT_MARKER = "trtqat_report"


@dataclass
class VariantResult:
    """Everything measured for one variant (one engine)."""

    name: str
    precision: str
    source: str = ""
    onnx: str | None = None
    engine: str | None = None
    status: str = "ok"  # "ok" | "failed"
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # top1, top5, ... (0..100)
    latency_ms: dict[int, float] = field(default_factory=dict)  # batch -> median latency
    throughput: dict[int, float] = field(default_factory=dict)  # batch -> images/s
    nodes: dict[str, int] = field(default_factory=dict)  # integer/float compute node counts
    providers: list[str] = field(default_factory=list)  # execution providers / backend used
    notes: list[str] = field(default_factory=list)  # e.g. a fallback taken while building
    # batch -> (max - min) / median over the interleaved timing rounds
    latency_spread: dict[int, float] = field(default_factory=dict)
    throughput_spread: dict[int, float] = field(default_factory=dict)
    rounds: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # per round
    failed_checks: list[str] = field(default_factory=list)  # measured anyway, marked
    emulated: bool = False  # the backend only emulates this precision (meant for TensorRT)
    onnx_mib: float | None = None  # the ONNX file's size (with its external data)
    predictions: Any = field(default=None, repr=False)  # top-1 per image (not in the JSON)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        del d["predictions"]
        for key in ("latency_ms", "throughput", "latency_spread", "throughput_spread",
                    "rounds"):
            d[key] = {str(k): v for k, v in getattr(self, key).items()}
        return d


def machine_info() -> dict[str, Any]:
    """The machine the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version()}


def library_versions() -> dict[str, str]:
    """Versions of the libraries that produced the figures."""
    import numpy
    import onnx
    import onnxruntime
    import torch

    import trtqat

    versions = {"trtqat": trtqat.__version__, "torch": torch.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__}
    try:  # only where TensorRT is installed
        import importlib.metadata as md

        versions["tensorrt"] = md.version("tensorrt")
    except Exception:
        pass
    return versions


def _ref(results: list[VariantResult]) -> VariantResult | None:
    return next((r for r in results if r.name == "fp32" and r.status == "ok"), None)


def _derived(r: VariantResult, ref: VariantResult | None, metric: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {"delta": None}
    if ref is not None and r.status == "ok" and metric in r.metrics and metric in ref.metrics:
        out["delta"] = r.metrics[metric] - ref.metrics[metric]
    for b, lat in r.latency_ms.items():
        ref_lat = ref.latency_ms.get(b) if ref else None
        out[f"speedup@{b}"] = (ref_lat / lat) if ref_lat and lat else None
    return out


def build_report(results: list[VariantResult], *, backend: str, providers: list[str],
                 batch_sizes: list[int], metric: str, dataset: dict[str, Any],
                 settings: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a comparison."""
    ref = _ref(results)
    variants = []
    for r in results:
        d = r.to_json()
        d["derived"] = {k: v for k, v in _derived(r, ref, metric).items()}
        variants.append(d)
    failed = [r.name for r in results if r.status != "ok"]
    unstable = [text for _, text in _unstable(variants)]
    return {
        REPORT_MARKER: "compare",
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "backend": backend,
        "providers": providers,
        "versions": library_versions(),
        "batch_sizes": batch_sizes,
        "metric": metric,
        "dataset": dataset,
        "settings": settings,
        "partial": bool(failed) and len(failed) < len(results),
        "failed": failed,
        "failed_checks": [r.name for r in results if r.failed_checks],
        "unstable": unstable,
        "spread": f"(max - min) / median over the interleaved timing rounds; > "
                  f"{UNSTABLE_SPREAD:.0%} is flagged as unstable",
        "variants": variants,
    }


def _unstable(variants: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """``(spread, "name latency@b ±sp")`` of every figure above :data:`UNSTABLE_SPREAD`."""
    return [(sp, f"{v['name']} {what}@{b} ±{sp:.0%}") for v in variants
            for what, key in (("latency", "latency_spread"), ("throughput", "throughput_spread"))
            for b, sp in (v.get(key) or {}).items() if sp > UNSTABLE_SPREAD]


def unstable_line(report: dict[str, Any], worst: int = 3) -> str | None:
    """One line for every unstable timing figure: their count and the ``worst`` few (the
    full list is report.json's ``unstable``); None when there is none."""
    flags = sorted(_unstable(report["variants"]), key=lambda f: -f[0])
    if not flags:
        return None
    return (f"UNSTABLE: {len(flags)} timing figure{'s' * (len(flags) > 1)} spread over "
            f"{UNSTABLE_SPREAD:.0%} (worst: {', '.join(t for _, t in flags[:worst])}; every one "
            "in report.json): the machine's load changed while measuring; rerun with a longer "
            "--duration on a quiet machine")


EMULATION_NOTE = (
    "(emulated): ONNX Runtime's CPU provider has no FP16 or FP8 kernels for these graphs, so "
    "it emulates them in float (casts around float kernels, FP8 Q/DQ in float32): that is "
    "why these rows are slow, and why FP16 accuracy may differ (the gap is the emulation's "
    "rounding, not TensorRT's FP16; FP8's accuracy is FP8's). They stay in the report so that "
    "the variant meant for TensorRT is exported and checked end to end; --variants leaves "
    "them out.")


def emulation_line(report: dict[str, Any]) -> str | None:
    """:data:`EMULATION_NOTE` when some variant is emulated, else None."""
    return EMULATION_NOTE if any(v.get("emulated") for v in report["variants"]) else None


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _with_spread(v: dict[str, Any], key: str, batch: int, spec: str) -> str:
    """``figure ±spread``, with ``!`` when the spread is above :data:`UNSTABLE_SPREAD`."""
    value = v[key].get(str(batch))
    sp = (v.get(f"{key.split('_')[0]}_spread") or {}).get(str(batch))
    if value is None or sp is None:
        return _fmt(value, spec)
    return f"{value:{spec}} ±{sp:.0%}" + (" !" if sp > UNSTABLE_SPREAD else "")


def _checks(v: dict[str, Any]) -> str:
    failed = v.get("failed_checks") or []
    return "ok" if not failed else f"FAILED: {failed[0].split(':')[0][:40]}"


def table_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table."""
    metric = report["metric"]
    bs = report["batch_sizes"]
    lat_b, thr_b = bs[0], bs[-1]
    encoder = metric == ENCODER_METRIC
    header = ["variant", "precision", metric, f"Δ{metric} vs fp32", "agree fp32 %",
              f"latency@{lat_b} ms", f"speedup@{lat_b}", f"img/s@{thr_b}", "ONNX MiB",
              "int/float nodes", "checks"]
    if encoder:  # embedding fidelity vs the FP32 PyTorch model replaces top-1 and its delta
        header[2:4] = ["cosine vs fp32", "Spearman"]
        header[7] = f"sent/s@{thr_b}"
    rows = []
    for v in report["variants"]:
        if v["status"] != "ok":
            rows.append([v["name"], v["precision"], "FAILED", (v["error"] or "")[:60], "", "",
                         "", "", "", "", "-"])
            continue
        d = v["derived"]
        nodes = v["nodes"]
        rows.append([
            v["name"], v["precision"] + (" (emulated)" if v.get("emulated") else ""),
            _fmt(v["metrics"].get(metric), ".5f" if encoder else ".2f"),
            _fmt(v["metrics"].get("spearman"), ".5f") if encoder else _fmt(d.get("delta"), "+.2f"),
            _fmt(v["metrics"].get("agree_fp32"), ".2f"),
            _with_spread(v, "latency_ms", lat_b, ".3f"),
            _fmt(d.get(f"speedup@{lat_b}"), ".2f") + ("x" if d.get(f"speedup@{lat_b}") else ""),
            _with_spread(v, "throughput", thr_b, ".1f"),
            _fmt(v.get("onnx_mib"), ".2f"),
            f"{nodes.get('integer', '-')}/{nodes.get('float', '-')}" if nodes else "-",
            _checks(v),
        ])
    return header, rows


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table for the terminal."""
    return text_table(*table_rows(report))


def format_markdown(report: dict[str, Any]) -> str:
    """report.md: the table plus the conditions of the measurement."""
    header, rows = table_rows(report)
    md = ["# trtqat comparison", ""]
    if report["partial"]:
        md += [f"**Partial report**: {', '.join(report['failed'])} failed; the other variants "
               "were measured.", ""]
    md += markdown_table(header, rows)
    m = report["machine"]
    md += ["", f"- backend: {report['backend']} ({', '.join(report['providers'])})",
           f"- machine: {m['cpu']}, {m['cores']} cores, {m['platform']}",
           f"- batch sizes: {', '.join(map(str, report['batch_sizes']))}",
           f"- dataset: {json.dumps(report['dataset'])}",
           f"- versions: {', '.join(f'{k} {v}' for k, v in report['versions'].items())}",
           f"- generated: {report['generated']}", ""]
    if report.get("spread"):
        md.append(f"- timing: median over interleaved rounds ±spread, {report['spread']}")
    md += [f"- {line}" for line in (unstable_line(report), emulation_line(report)) if line]
    for v in report["variants"]:
        if v["status"] != "ok":
            md.append(f"- {v['name']} failed: {v['error']}")
        for check in v.get("failed_checks") or []:
            md.append(f"- {v['name']} FAILED CHECK (measured anyway): {check}")
        for note in v.get("notes") or []:
            md.append(f"- {v['name']}: {note}")
    return "\n".join(md) + "\n"


def is_report_json(path: Path) -> bool:
    """A report.json that trtqat wrote: a comparison's or the demo's (both carry
    :data:`REPORT_MARKER`; earlier ones are recognised by their keys)."""
    from trtqat.atomic import json_with_keys

    return any(json_with_keys(*keys)(path) for keys in (
        (REPORT_MARKER,), ("variants", "backend", "metric"), ("models", "generated")))


def refuse_foreign_reports(out_dir: str | os.PathLike) -> None:
    """Refuse (before any work) an ``out_dir`` whose report.json/md/png are not earlier
    trtqat reports (of ``compare`` or ``demo``): they would be overwritten."""
    from trtqat.atomic import PNG, refuse_foreign, starts_with

    out = Path(out_dir)
    refuse_foreign(out / "report.json", is_report_json, "an earlier trtqat report", "--out")
    refuse_foreign(out / "report.md", starts_with(b"# trtqat comparison", b"# trtqat demo"),
                   "an earlier trtqat report", "--out")
    refuse_foreign(out / "report.png", PNG, "an earlier trtqat chart", "--out")


def write_report(report: dict[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write report.json, report.md and report.png into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    paths = {"json": out / "report.json", "md": out / "report.md", "png": out / "report.png"}
    write_json(paths["json"], report)
    write_atomic(paths["md"], lambda f: f.write(format_markdown(report).encode()))
    plot_report(report, paths["png"])
    return paths

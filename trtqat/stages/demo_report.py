"""The demo's report of every model: ``report.md``, ``report.json`` and ``report.png``.

``report.md`` opens with one line per model (FP32, the QAT start, the best PTQ engine and
QAT, as the engines score them, and the INT8 speed-up), then a section per model: the
comparison
table of its engines (timings as medians over interleaved rounds with their spread) and
the top-1 its training stages reached in PyTorch. ``report.png`` holds a row of panels per
model (:mod:`trtqat.stages.compare.plot`).

Two "best PTQ"s, named apart: the *QAT start* is the best PyTorch calibrator (the
``ptq-*`` run with the best fake-quant top-1, which QAT fine-tunes); the *best PTQ engine* is
the ``ptq-*`` engine with the best score in the comparison table. They usually agree; where
they do not, the engines disagree with PyTorch's fake quantization by more than the gap
between the calibrators.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtqat.atomic import write_atomic, write_json
from trtqat.families.types import MappingView
from trtqat.stages.compare.plot import plot_reports
from trtqat.stages.compare.report import REPORT_MARKER, emulation_line, table_rows, unstable_line
from trtqat.stages.compare.result import CompareReport
from trtqat.tables import markdown_table, text_table


@dataclass
class DemoSection:
    """One model of the demo: its comparison and the PyTorch top-1 of its training stages
    (``fp32``, ``ptq-<calibrator>``, ``qat-int8``: the best epoch's, as the run folders
    record it), and the wall time of its four stages."""

    model: str
    folder: str
    report: CompareReport
    pytorch_top1: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def qat_start(self) -> str | None:
        """The best INT8 PyTorch calibrator (``ptq-*`` by fake-quant top-1, the first best,
        as ``trtqat demo`` picks it): where INT8 QAT started."""
        return self.qat_starts.get("int8")

    @property
    def qat_starts(self) -> dict[str, str]:
        """Each format's best PyTorch calibrator (its ``ptq-*`` runs), where its QAT started."""
        starts: dict[str, str] = {}
        for fmt in dict.fromkeys(run_format(k) for k in self.pytorch_top1 if k.startswith("ptq")):
            ptq = [k for k in self.pytorch_top1 if k.startswith("ptq") and run_format(k) == fmt]
            starts[fmt] = max(ptq, key=self.pytorch_top1.__getitem__)
        return starts


def run_format(name: str) -> str:
    """The format of a demo run or variant name: ``ptq-max-fp8``/``qat-fp8`` -> fp8;
    INT8's keep the names they had before formats (``ptq-max``, ``qat-int8``)."""
    from trtqat.formats import FORMATS

    return next((f for f in FORMATS if name.endswith(f"-{f}") or name.startswith(f"qat-{f}")),
                "int8")


@dataclass
class DemoReport(MappingView):
    """What ``trtqat demo`` returns: each model's comparison, the summary of them all and
    where the demo's report went (``files``: md, json, png)."""

    sections: list[DemoSection]
    document: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)
    glance: str = ""  # the summary table, as the terminal shows it

    @property
    def reports(self) -> dict[str, CompareReport]:
        """Each model's comparison, by model name."""
        return {s.model: s.report for s in self.sections}

    @property
    def partial(self) -> bool:
        """Some variant of some model failed (``trtqat demo`` exits 1)."""
        return any(s.report.partial for s in self.sections)

    @property
    def ok(self) -> bool:
        """Every variant of every model measured, every check passed."""
        return all(s.report.ok for s in self.sections)

    def _view(self) -> dict[str, Any]:
        return {**self.document, "files": {k: str(v) for k, v in self.files.items()}}


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """What QAT is for, in one model's report.json: the engines' metric of FP32, of the best
    PTQ engine (``best_ptq``: the ``ptq-*`` engine that scores best, not necessarily the QAT
    start) and of QAT INT8, their differences, and QAT INT8's speed-up per batch size
    (FP32's median latency over its own; None where a variant is missing)."""
    metric = doc["metric"]
    ok = {v["name"]: v for v in doc["variants"] if v["status"] == "ok"
          and v["metrics"].get(metric) is not None}
    score = {name: float(v["metrics"][metric]) for name, v in ok.items()}
    fp32 = score.get("fp32")
    formats = {fmt: _format_summary(ok, score, fp32, fmt, doc["batch_sizes"])
               for fmt in dict.fromkeys(run_format(n) for n in ok
                                        if n.startswith(("ptq", "qat")))}
    int8 = formats.get("int8") or _format_summary(ok, score, fp32, "int8", doc["batch_sizes"])
    return {"metric": metric, "fp32": fp32, **{k: v for k, v in int8.items() if k != "speedup"},
            "int8_speedup": int8["speedup"], "formats": formats}


def _format_summary(ok: dict[str, Any], score: dict[str, float], fp32: float | None, fmt: str,
                    batch_sizes: list[int]) -> dict[str, Any]:
    """One format's best PTQ engine, QAT and QAT's speed-up (None where missing)."""
    ptq = [n for n in ok if n.startswith("ptq") and run_format(n) == fmt]
    best = max(ptq, key=lambda n: score[n]) if ptq else None  # first best, in report order
    qat_name = f"qat-{fmt}"
    qat = score.get(qat_name)
    diff = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
    best_score = score[best] if best else None
    speedup = {str(b): (ok[qat_name]["derived"].get(f"speedup@{b}")
                        if qat_name in ok else None) for b in batch_sizes}
    return {"best_ptq": best, "best_ptq_score": best_score, "qat": qat,
            "best_ptq_minus_fp32": diff(best_score, fp32), "qat_minus_fp32": diff(qat, fp32),
            "qat_minus_best_ptq": diff(qat, best_score), "speedup": speedup}


def _f(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def glance_rows(sections: list[DemoSection]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the one-line-per-model summary."""
    docs = [s.report.document for s in sections]
    bs = docs[0]["batch_sizes"] if docs else []
    metric = docs[0]["metric"] if docs else "top1"
    header = ["model", f"FP32 {metric}", "QAT start (best PyTorch calibrator)",
              "best PTQ engine", f"best PTQ engine {metric} (vs FP32)",
              f"QAT INT8 {metric} (vs FP32)", "QAT - best PTQ engine",
              *(f"QAT INT8 speed-up @{b}" for b in bs)]
    summaries = [summary(doc) for doc in docs]
    others = list(dict.fromkeys(f for m in summaries for f in m["formats"] if f != "int8"))
    for fmt in others:  # FP8 / INT4: their best PTQ engine and QAT beside INT8's
        header += [f"best PTQ {fmt.upper()} engine {metric} (vs FP32)",
                   f"QAT {fmt.upper()} {metric} (vs FP32)"]
    rows = []
    for s, m in zip(sections, summaries):
        row = [
            s.model, _f(m["fp32"], ".2f"), s.qat_start or "-", m["best_ptq"] or "-",
            f"{_f(m['best_ptq_score'], '.2f')} ({_f(m['best_ptq_minus_fp32'], '+.2f')})",
            f"{_f(m['qat'], '.2f')} ({_f(m['qat_minus_fp32'], '+.2f')})",
            _f(m["qat_minus_best_ptq"], "+.2f"),
            *(_f(m["int8_speedup"].get(str(b)), ".2f", "x") for b in bs)]
        for fmt in others:
            f = m["formats"].get(fmt) or {}
            row += [f"{f.get('best_ptq') or '-'} {_f(f.get('best_ptq_score'), '.2f')} "
                    f"({_f(f.get('best_ptq_minus_fp32'), '+.2f')})",
                    f"{_f(f.get('qat'), '.2f')} ({_f(f.get('qat_minus_fp32'), '+.2f')})"]
        rows.append(row)
    return header, rows


def format_glance(sections: list[DemoSection]) -> str:
    """The summary as plain text for the terminal."""
    return text_table(*glance_rows(sections))


def format_markdown(sections: list[DemoSection], document: dict[str, Any]) -> str:
    """report.md of the demo."""
    first = sections[0].report.document
    m = first["machine"]
    md = ["# trtqat demo", "",
          f"Every model: FP32 training, PTQ with every calibrator, QAT from the QAT start (the "
          f"best PyTorch calibrator), {first['backend']} engines of each variant on {m['cpu']} "
          f"({m['cores']} cores). Accuracy is the engines' on the validation split; timings "
          "are medians over interleaved rounds, ± their spread (max - min) / median.", "",
          *markdown_table(*glance_rows(sections)), "", "![every model](report.png)", ""]
    for s in sections:
        doc = s.report.document
        md += [f"## {s.model}", ""]
        if doc["partial"]:
            md += [f"**Partial**: {', '.join(doc['failed'])} failed; the other variants were "
                   "measured.", ""]
        md += markdown_table(*table_rows(doc))
        if s.pytorch_top1:
            cells = ", ".join(f"{k} {v:.2f}" for k, v in s.pytorch_top1.items() if v >= 0)
            md += ["", f"- PyTorch top-1 of the training stages (fake quantization, best "
                   f"epoch): {cells}"]
        md += [f"- run folders: `{doc['settings'].get('run')}`; engines and this model's own "
               f"report: `{s.folder}/`; stages took {s.wall_s:.0f} s"]
        for v in doc["variants"]:
            if v["status"] != "ok":
                md.append(f"- {v['name']} failed: {v['error']}")
            for check in v.get("failed_checks") or []:
                md.append(f"- {v['name']} FAILED CHECK (measured anyway): {check}")
        md += [f"- {line}" for line in (unstable_line(doc),) if line]
        md.append("")
    emulated = next(filter(None, (emulation_line(s.report.document) for s in sections)), None)
    md += [f"- {emulated}"] if emulated else []
    md += [f"- versions: {', '.join(f'{k} {v}' for k, v in first['versions'].items())}",
           f"- generated: {document['generated']}", ""]
    return "\n".join(md)


def write_demo_report(sections: list[DemoSection], out_dir: str | Path) -> DemoReport:
    """Write report.md, report.json and report.png of ``sections`` into ``out_dir``."""
    out = Path(out_dir)
    document = {
        REPORT_MARKER: "demo",
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "models": [{"model": s.model, "folder": s.folder, "qat_start": s.qat_start,
                    "qat_starts": s.qat_starts,
                    "summary": summary(s.report.document),
                    "pytorch_top1": s.pytorch_top1, "wall_s": s.wall_s,
                    "report": s.report.document} for s in sections]}
    paths = {"json": out / "report.json", "md": out / "report.md", "png": out / "report.png"}
    write_json(paths["json"], document)
    write_atomic(paths["md"], lambda f: f.write(format_markdown(sections, document).encode()))
    first = sections[0].report.document
    plot_reports([(s.model, s.report.document) for s in sections], paths["png"],
                 f"trtqat demo: {first['backend']} engines on {first['machine']['cpu']}")
    return DemoReport(sections, document, paths, format_glance(sections))

"""The demo's report of several models: a summary line per model, a section per model."""

from __future__ import annotations

import json

import pytest

from trtqat.errors import TrtqatError
from trtqat.stages.compare.report import VariantResult, build_report
from trtqat.stages.compare.result import CompareReport
from trtqat.stages.demo_report import (
    DemoSection,
    summary,
    write_demo_report,
)


def _doc(fp32: float, ptq: dict[str, float], qat: float, fp32_ms: float, int8_ms: float,
         failed: bool = False) -> dict:
    def result(name, precision, top1, ms):
        return VariantResult(name, precision, metrics={"top1": top1},
                             latency_ms={1: ms, 32: 20 * ms}, throughput={1: 1e3 / ms,
                                                                          32: 32e3 / (20 * ms)},
                             latency_spread={1: 0.04, 32: 0.02},
                             throughput_spread={1: 0.04, 32: 0.2})
    results = [result("fp32", "fp32", fp32, fp32_ms)]
    results += [result(name, "int8", top1, int8_ms) for name, top1 in ptq.items()]
    results.append(result("qat-int8", "int8", qat, int8_ms))
    if failed:
        results.append(VariantResult("qat-int8-fp16", "int8-fp16", status="failed",
                                     error="build failed"))
    return build_report(results, backend="ort", providers=["CPUExecutionProvider"],
                        batch_sizes=[1, 32], metric="top1", dataset={"data": "digits"},
                        settings={"run": "runs/demo/m", "model": "m"})


def test_summary_names_the_best_ptq_and_what_qat_recovers():
    doc = _doc(97.5, {"ptq-max": 93.0, "ptq-mse": 96.0, "ptq-entropy": 96.0}, 97.25, 3.0, 1.0)
    s = summary(doc)
    assert s["best_ptq"] == "ptq-mse"  # the first of the best, in report order
    assert s["best_ptq_minus_fp32"] == pytest.approx(-1.5)
    assert s["qat_minus_fp32"] == pytest.approx(-0.25)
    assert s["qat_minus_best_ptq"] == pytest.approx(1.25)
    assert s["int8_speedup"] == {"1": pytest.approx(3.0), "32": pytest.approx(3.0)}
    without_qat = _doc(97.5, {"ptq-max": 93.0}, 97.0, 3.0, 1.0)
    without_qat["variants"] = [v for v in without_qat["variants"] if v["name"] != "qat-int8"]
    s = summary(without_qat)
    assert s["qat"] is None and s["qat_minus_best_ptq"] is None and s["int8_speedup"]["1"] is None


def test_report_has_a_line_and_a_section_per_model(tmp_path):
    sections = [
        DemoSection("resnet18", "resnet18", CompareReport(_doc(
            98.6, {"ptq-max": 98.3, "ptq-entropy": 98.9}, 98.6, 3.0, 1.0), []),
            {"fp32": 98.9, "ptq-max": 98.0, "qat-int8": 98.6}, 120.0),
        DemoSection("mobilenet_v2", "mobilenet_v2", CompareReport(_doc(
            97.5, {"ptq-max": 93.0, "ptq-mse": 96.0}, 97.25, 2.0, 1.0, failed=True), []),
            {"fp32": 97.8}, 300.0)]
    demo = write_demo_report(sections, tmp_path)
    md = demo.files["md"].read_text()
    assert md.index("## resnet18") < md.index("## mobilenet_v2")
    # two "best PTQ"s, named apart: where QAT started (PyTorch) and the best PTQ engine
    assert "| QAT start (best PyTorch calibrator) | best PTQ engine |" in md
    assert "| mobilenet_v2 | 97.50 | - | ptq-mse | 96.00 (-1.50) | 97.25 (-0.25) | +1.25 |" in md
    assert ("| resnet18 | 98.60 | ptq-max | ptq-entropy | 98.90 (+0.30) | 98.60 (+0.00) "
            "| -0.30 |") in md
    # each model's unstable figures: one line (throughput@32 of every variant here)
    unstable = [line for line in md.splitlines() if "UNSTABLE" in line]
    assert len(unstable) == 2 and unstable[0].startswith("- UNSTABLE: 4 timing figures")
    assert "qat-int8-fp16 failed: build failed" in md and "**Partial**" in md
    assert "fp32 98.90, ptq-max 98.00, qat-int8 98.60" in md  # PyTorch top-1 of the stages
    saved = json.loads(demo.files["json"].read_text())
    assert [m["model"] for m in saved["models"]] == ["resnet18", "mobilenet_v2"]
    assert [m["qat_start"] for m in saved["models"]] == ["ptq-max", None]
    assert len(saved["models"][0]["report"]["unstable"]) == 4
    assert saved["models"][1]["summary"]["qat_minus_best_ptq"] == pytest.approx(1.25)
    assert demo.files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert demo.partial and not demo.ok  # one variant of one model failed
    assert set(demo.reports) == {"resnet18", "mobilenet_v2"}
    assert demo["models"][0]["wall_s"] == 120.0
    assert "mobilenet_v2" in demo.glance.splitlines()[-1]
    # its own reports (and compare's) are replaced by the next demo, nothing else is
    from trtqat.stages.compare.report import refuse_foreign_reports

    refuse_foreign_reports(tmp_path)
    (tmp_path / "report.md").write_text("# my notes\n")
    with pytest.raises(TrtqatError, match="report.md exists and is not an earlier trtqat report"):
        refuse_foreign_reports(tmp_path)


def test_demo_refuses_an_unknown_model_before_any_model_trains(tmp_path):
    from trtqat.errors import TrtqatError
    from trtqat.stages.demo import DemoConfig, run_demo

    lines: list[str] = []
    with pytest.raises(TrtqatError, match="nosuchmodel"):
        run_demo(DemoConfig(model="resnet18,nosuchmodel", epochs=1, progress=False,
                            runs=str(tmp_path / "runs"), out=str(tmp_path / "engines"),
                            export_dir=str(tmp_path / "export")), echo=lines.append)
    assert lines == [] and not (tmp_path / "runs").exists()

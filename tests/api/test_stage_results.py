"""Typed stage results: fields for new code, the dicts of earlier versions for old code."""

from __future__ import annotations

import dataclasses

import pytest

from trtqat import families
from trtqat.cli.options import print_summary
from trtqat.families.types import StageResult
from trtqat.stages.compare.report import VariantResult, build_report
from trtqat.stages.compare.result import CompareReport


def test_a_stage_result_reads_like_the_old_dict():
    result = StageResult("qat", "runs/qat", {"epoch": 2, "val_top1": 90.0}, best=91.5,
                         before=88.0, summary="qat: ...")
    assert dict(result) == {"last": {"epoch": 2, "val_top1": 90.0}, "out": "runs/qat",
                            "best_top1": 91.5, "start_top1": 88.0, "summary": "qat: ..."}
    assert result.get("best_top1") == 91.5 and "fidelity" not in result
    with pytest.raises(KeyError):
        result["fidelity"]
    unscored = StageResult("calibrate", "runs/ptq", {"val_top1": None})
    assert unscored["best_top1"] == -1.0 and "start_top1" not in unscored  # as before
    encoder = StageResult("calibrate", "runs/ptq", {}, best=0.99, metric="mean_cosine",
                          details={"fidelity": {"mean_cosine": 0.99}, "fp32": "runs/fp32"})
    assert encoder["fidelity"]["mean_cosine"] == 0.99 and "best_top1" not in encoder


def test_a_family_that_returns_an_old_dict_still_gets_its_summary(capsys):
    cnn = families.get("cnn")
    old = {"last": {"method": "max"}, "best_top1": 75.0, "out": "runs/ptq", "extra": 1}
    result = families.summarized(cnn, "calibrate", old)
    assert isinstance(result, StageResult) and result.stage == "calibrate"
    assert (result.best, result.details) == (75.0, {"extra": 1})
    assert result.summary == "calibrate (max): best val top-1 75.00%; run folder runs/ptq"
    print_summary(result)
    assert capsys.readouterr().err == result.summary + "\n"
    assert families.summarized(cnn, "train", dataclasses.replace(result, best=None)
                               ).summary == "train; run folder runs/ptq"


def test_the_compare_report_is_typed_and_reads_like_report_json(tmp_path):
    results = [VariantResult("fp32", "fp32", metrics={"top1": 90.0}, latency_ms={1: 2.0}),
               VariantResult("qat-int8", "int8", status="failed", error="boom")]
    document = build_report(results, backend="ort", providers=["cpu"], batch_sizes=[1],
                            metric="top1", dataset={}, settings={})
    report = CompareReport(document, results, {"json": tmp_path / "report.json"})
    assert report.partial and report.failed == ["qat-int8"] and not report.ok
    assert report.variant("fp32").metrics == {"top1": 90.0} and report.metric == "top1"
    assert report["files"] == {"json": str(tmp_path / "report.json")}
    assert report["variants"][1]["error"] == "boom" and report.get("partial") is True
    with pytest.raises(KeyError, match="no variant 'ptq-max'"):
        report.variant("ptq-max")

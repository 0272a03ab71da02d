"""``trtqat compare`` right after ``trtqat demo``: it finds the demo's run folder
(``runs/demo/<model>``), writes beside the demo's engines and may replace the demo's report,
while a file that is not a trtqat report is still refused. Every test runs in its own
``tmp_path`` as the working directory (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtqat.atomic import ForeignFileError
from trtqat.cli import main
from trtqat.runs.checkpoint import save_checkpoint
from trtqat.stages.compare.report import (
    VariantResult,
    build_report,
    refuse_foreign_reports,
    write_report,
)
from trtqat.stages.compare.result import CompareReport
from trtqat.stages.compare.run import CompareConfig, default_out
from trtqat.stages.compare.variants import CompareError, resolve_run
from trtqat.stages.demo_report import DemoSection, write_demo_report


def _ckpt(path: Path, stage: str, arch: str, **extra) -> None:
    path.mkdir(parents=True)
    save_checkpoint(path / "best.pt", {"stage": stage, "model": {"arch": arch, "num_classes": 10},
                                       "args": {"data": "digits"}, "state_dict": {}, **extra})


def _doc() -> dict:
    results = [VariantResult(name, precision, metrics={"top1": 98.0}, latency_ms={1: 1.0},
                             throughput={1: 1e3}, latency_spread={1: 0.01},
                             throughput_spread={1: 0.01})
               for name, precision in (("fp32", "fp32"), ("ptq-max", "int8"), ("qat-int8", "int8"))]
    return build_report(results, backend="ort", providers=["CPUExecutionProvider"],
                        batch_sizes=[1], metric="top1", dataset={"data": "digits"},
                        settings={"run": "runs/demo/resnet18", "model": "resnet18"})


def _demo_runs(root: Path, *models: str) -> None:
    """The run folders ``trtqat demo`` writes: runs/demo/<model>/{fp32,ptq-max,qat}."""
    for model in models:
        for stage, folder in (("fp32", "fp32"), ("ptq", "ptq-max"), ("qat", "qat")):
            _ckpt(root / "runs" / "demo" / model / folder, stage, model,
                  calib={"method": "max"} if stage == "ptq" else {})


def _demo_report(out: Path) -> None:
    """What the demo leaves in engines/: its own report of every model."""
    doc = _doc()
    write_demo_report([DemoSection("resnet18", "resnet18", CompareReport(doc, []))], out)
    write_report(doc, out / "resnet18")  # and the model's compare report


def test_the_demo_run_folder_is_found(tmp_path):
    _demo_runs(tmp_path, "resnet18")
    assert CompareConfig().run == "runs/demo"  # bare `trtqat compare`
    assert resolve_run("runs/demo") == Path("runs/demo/resnet18")
    assert resolve_run("runs/demo/resnet18") == Path("runs/demo/resnet18")
    assert default_out("runs/demo/resnet18") == str(Path("engines/resnet18"))
    assert default_out(None) == "engines"


def test_several_models_are_named_in_one_line(tmp_path, capsys):
    _demo_runs(tmp_path, "resnet18", "mobilenet_v2")
    with pytest.raises(CompareError, match=r"2 models \(mobilenet_v2, resnet18\).*--run "
                       r"runs/demo/mobilenet_v2"):
        resolve_run("runs/demo")
    assert main(["compare", "--run", "runs/demo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pick one" in err[0] and "Traceback" not in err[0]


def test_without_a_run_folder_the_error_names_the_fix(tmp_path, capsys):
    assert main(["compare"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--run" in err[0] and "trtqat demo" in err[0]


def test_compare_replaces_the_demo_report_but_not_a_foreign_file(tmp_path):
    _demo_report(tmp_path / "engines")
    refuse_foreign_reports(tmp_path / "engines")  # the demo's report: replaceable
    refuse_foreign_reports(tmp_path / "engines" / "resnet18")  # a compare report too
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "report.json").write_text('{"my": "data"}')
    with pytest.raises(ForeignFileError, match="not an earlier trtqat report"):
        refuse_foreign_reports(tmp_path / "mine")
    (tmp_path / "mine" / "report.json").unlink()
    (tmp_path / "mine" / "report.md").write_text("# my notes\n")
    with pytest.raises(ForeignFileError, match="report.md exists"):
        refuse_foreign_reports(tmp_path / "mine")

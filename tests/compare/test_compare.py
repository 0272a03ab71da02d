"""A miniature compare: tiny ResNet18 on 16x16 digits, two variants, short measurements."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from trtqat.stages.calibrate import CalibrateConfig, calibrate
from trtqat.stages.compare.run import CompareConfig, compare
from trtqat.stages.compare.variants import CompareError
from trtqat.stages.train import TrainConfig, train_fp32

TINY = {"data": "digits", "image_size": 16, "progress": False, "device": "cpu", "seed": 0}


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    """fp32/ and ptq-max/ run folders of a briefly trained ResNet18."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("compare") / "runs"
    train_fp32(TrainConfig(model="resnet18", epochs=2, out=str(root / "fp32"), **TINY))  # ~89%
    calibrate(CalibrateConfig(checkpoint=str(root / "fp32" / "best.pt"), out=str(root / "ptq-max"),
                              method="max", num_batches=4, progress=False, device="cpu"))
    torch.set_num_threads(n)
    return root


@pytest.fixture(scope="module")
def report(run_root, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("out")
    broken = out / "wrong-size.onnx"  # a valid ONNX that cannot take the data: it must fail
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                     ir_version=10), broken)
    cfg = CompareConfig(run=str(run_root), onnx=(str(broken),), batch_sizes=(1, 8),
                        export_dir=str(out / "export"), out=str(out / "engines"),
                        duration_s=0.2, warmup_ms=20, threads=1, calib_batches=2,
                        variants=("fp32", "ptq-max", "wrong-size"), progress=False)
    return compare(cfg, echo=lambda _: None)


def test_report_files_and_structure(report):
    files = {k: Path(v) for k, v in report["files"].items()}
    saved = json.loads(files["json"].read_text())
    for key in ("machine", "backend", "providers", "versions", "batch_sizes", "dataset",
                "generated", "variants", "partial", "failed"):
        assert key in saved, key
    assert saved["backend"] == "ort" and saved["batch_sizes"] == [1, 8]
    assert "CPUExecutionProvider" in saved["providers"]
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = files["md"].read_text()
    assert "| fp32 |" in md and "| ptq-max |" in md and "Partial report" in md


def test_every_number_was_measured(report):
    ok = {v["name"]: v for v in report["variants"] if v["status"] == "ok"}
    assert set(ok) == {"fp32", "ptq-max"}
    for v in ok.values():
        assert 0.0 <= v["metrics"]["top1"] <= 100.0 and 0.0 <= v["metrics"]["top5"] <= 100.0
        for b in ("1", "8"):
            assert math.isfinite(v["latency_ms"][b]) and v["latency_ms"][b] > 0
            assert math.isfinite(v["throughput"][b]) and v["throughput"][b] > 0
        assert Path(v["onnx"]).is_file() and Path(v["engine"]).is_file()
    assert ok["fp32"]["derived"]["delta"] == 0.0
    assert ok["ptq-max"]["derived"]["delta"] == pytest.approx(
        ok["ptq-max"]["metrics"]["top1"] - ok["fp32"]["metrics"]["top1"])
    assert ok["ptq-max"]["nodes"]["integer"] > 0  # the INT8 engine runs integer kernels
    assert ok["fp32"]["metrics"]["agree_fp32"] == 100.0  # top-1 agreement with FP32's engine
    assert 0.0 <= ok["ptq-max"]["metrics"]["agree_fp32"] <= 100.0
    assert ok["ptq-max"]["onnx_mib"] < ok["fp32"]["onnx_mib"]  # int8 weights: 1 byte each
    assert ok["fp32"]["nodes"]["integer"] == 0
    # the one naming rule of trtqat export: <arch>-ptq-<method>-<variant>
    assert Path(ok["ptq-max"]["onnx"]).name == "resnet18-ptq-max-int8.onnx"
    assert Path(ok["fp32"]["onnx"]).name == "resnet18-fp32.onnx"
    # accuracy is the engine's own: compare with top-1 recomputed from the ONNX file
    assert ok["fp32"]["metrics"]["top1"] > 50.0


def test_a_failing_variant_is_reported_and_the_others_run(report):
    failed = [v for v in report["variants"] if v["status"] != "ok"]
    assert [v["name"] for v in failed] == ["wrong-size"]
    assert failed[0]["error"] and report["partial"] is True and report["failed"] == ["wrong-size"]


@pytest.fixture(params=["clean", "after-demo"])
def cwd_state(request, tmp_path) -> str:
    """The working directory (tmp_path, tests/conftest.py) as a fresh clone has it, or as
    ``make demo`` leaves it: engines/report.json and report.md present (here of no
    comparison, the worst case); the errors below must not depend on it."""
    if request.param == "after-demo":
        (tmp_path / "engines").mkdir()
        (tmp_path / "engines" / "report.json").write_text('{"models": []}')
        (tmp_path / "engines" / "report.md").write_text("# not a comparison\n")
    return request.param


def test_bad_input(tmp_path, run_root, cwd_state):
    with pytest.raises(CompareError, match="no checkpoints"):
        compare(CompareConfig(run=str(tmp_path), out=str(tmp_path / "e")), echo=lambda _: None)
    with pytest.raises(CompareError, match="does not exist"):
        compare(CompareConfig(run=str(tmp_path / "nope")), echo=lambda _: None)
    with pytest.raises(CompareError, match="fewer than the largest batch size"):
        compare(CompareConfig(run=str(run_root), batch_sizes=(1, 100000),
                              out=str(tmp_path / "e"), export_dir=str(tmp_path / "x")),
                echo=lambda _: None)
    with pytest.raises(CompareError, match="not installed"):
        compare(CompareConfig(run=str(run_root), backend="tensorrt"), echo=lambda _: None)
    assert not (tmp_path / "e" / "report.json").exists()


def test_cli_one_line_error(tmp_path, capsys, cwd_state):
    from trtqat.cli import main

    assert main(["compare", "--run", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no checkpoints" in err[0]


@pytest.mark.slow
def test_bare_compare_after_the_demo(run_root, tmp_path, capsys):
    """`trtqat compare` with no option, in a folder where the demo ran: it compares the
    demo's model and writes beside the demo's engines, keeping the demo's own report."""
    import shutil

    from trtqat.cli import main
    from trtqat.stages.compare.report import VariantResult, build_report
    from trtqat.stages.compare.result import CompareReport
    from trtqat.stages.demo_report import DemoSection, write_demo_report

    shutil.copytree(run_root, tmp_path / "runs" / "demo" / "resnet18")
    doc = build_report([VariantResult("fp32", "fp32", metrics={"top1": 90.0})], backend="ort",
                       providers=[], batch_sizes=[1], metric="top1", dataset={}, settings={})
    write_demo_report([DemoSection("resnet18", "resnet18", CompareReport(doc, []))], "engines")
    write_demo_report([DemoSection("resnet18", "resnet18", CompareReport(doc, []))],
                      "engines/resnet18")  # even a demo report there is replaced
    demo_json = (tmp_path / "engines" / "report.json").read_text()
    assert main(["compare", "--variants", "fp32", "--batch-sizes", "1", "--duration", "0.05",
                 "--warmup", "0", "--threads", "1"]) == 0
    again = json.loads((tmp_path / "engines" / "resnet18" / "report.json").read_text())
    assert again["settings"]["run"] == str(Path("runs/demo/resnet18"))
    assert again["variants"][0]["status"] == "ok"
    assert (tmp_path / "engines" / "report.json").read_text() == demo_json
    capsys.readouterr()


def test_feed_is_real_validation_images(run_root):
    from trtqat import families
    from trtqat.families.cnn.compare_data import image_data

    cfg = CompareConfig(run=str(run_root), batch_sizes=(8,), calib_batches=1)
    data = families.get("cnn").compare_data([], {"data": "digits", "image_size": 16}, cfg)
    assert data is not None and data.metric == "top1"
    feed = data.timing(8)
    assert feed.shape == (8, 3, 16, 16) and np.array_equal(feed, data.batches[0][:8])
    assert len(data.targets) == sum(len(b) for b in data.batches)
    assert image_data.__module__ == "trtqat.families.cnn.compare_data"

"""Detectors through the command line: the built-in detector and a user's detector file
(train, calibrate, qat, export with NMS, compare). Tiny data and steps. Ultralytics models:
test_yolov8_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from cli_run import ROOT, TINY, trtqat

pytestmark = pytest.mark.slow


def test_builtin_detector_end_to_end(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = trtqat("train", "--model", "yolo_digits", "--epochs", "1", "--image-size", "64",
                 "--out", str(runs / "fp32"), *TINY)
    assert "train: best val mAP@[.5:.95]" in out
    trtqat("calibrate", "--checkpoint", str(runs / "fp32"), "--num-batches", "2",
           "--out", str(runs / "ptq"), *TINY)
    out = trtqat("qat", "--checkpoint", str(runs / "ptq"), "--distill", "0.5",
                 "--out", str(runs / "qat"), *TINY)
    assert "qat: best val mAP" in out
    args = json.dumps(__import__("yaml").safe_load((runs / "qat" / "args.yaml").read_text()))
    assert '"distill": 0.5' in args and '"lr": 0.0005' in args  # 10% of the FP32 lr
    out = trtqat("export", "--checkpoint", str(runs / "qat"), "--variant", "int8", "--nms",
                 "--val-batches", "1", "--output-names", "preds", "--out", str(tmp_path / "x"))
    assert "FAIL" not in out, out
    assert "output 'preds' boxes vs PyTorch fake-quant" in out
    assert "skipped on purpose" in out and "0 warning(s)" in out
    model = onnx.load(str(tmp_path / "x" / "yolo_digits-qat-int8-nms.onnx"))
    assert [o.name for o in model.graph.output] == ["preds", "detections"]
    assert [i.name for i in model.graph.input] == ["images"]
    assert any(n.op_type == "NonMaxSuppression" for n in model.graph.node)
    trtqat("compare", "--run", str(runs), "--variants", "qat-int8", "--duration", "0.1",
           "--batch-sizes", "1", "--export-dir", str(tmp_path / "x"),  # reuses the export
           "--out", str(tmp_path / "engines"))
    report = json.loads((tmp_path / "engines" / "report.json").read_text())
    assert report["metric"] == "map"
    assert [(v["name"], v["status"]) for v in report["variants"]] == [("qat-int8", "ok")]
    assert 0.0 <= report["variants"][0]["metrics"]["map50"] <= 100.0


MY_DET = '''
from trtqat.families.detect.yolo import YoloDigits

def make(num_classes=3):
    model = YoloDigits(num_classes, widths=(8, 16, 16, 16))
    model.trtqat_float_layers = ("head.box.*", "head.cls.*")
    return model
'''


def test_user_detector_file_needs_the_prefix(tmp_path: Path) -> None:
    (tmp_path / "my_det.py").write_text(MY_DET)
    trtqat("calibrate", "--model", f"detect:{tmp_path / 'my_det.py'}:make", "--image-size", "64",
           "--num-batches", "1", "--out", str(tmp_path / "ptq"), *TINY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "trtqat", "calibrate", "--model",
                           f"{tmp_path / 'my_det.py'}:make", "--image-size", "64",
                           "--out", str(tmp_path / "cnn"), *TINY], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode != 0 and "--model detect:" in proc.stderr

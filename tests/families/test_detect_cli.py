"""Detectors through the command line: the built-in detector and a user's detector file
(train, calibrate, qat, export with NMS, compare), and an Ultralytics YOLOv8n from its yaml
(calibrate -> qat -> export, lint clean -> ORT engine -> trtqat-exec --shapes=images:...),
saved as an Ultralytics checkpoint that Ultralytics loads. Tiny data and steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def trtqat(*args: str, cwd: Path | None = None, module: str = "trtqat") -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "YOLO_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


TINY = ("--limit-batches", "1", "--batch-size", "4", "--no-progress")


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
    assert '"distill": 0.5' in args and '"lr": 5e-05' in args  # 1% of the FP32 lr
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
           "--batch-sizes", "1", "--export-dir", str(tmp_path / "e"),
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


def test_yolov8n_from_ultralytics_yaml_to_trtexec(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    runs = tmp_path / "runs"
    trtqat("calibrate", "--model", "yolov8n.yaml", "--image-size", "320", "--num-batches", "1",
           "--out", str(runs / "ptq"), *TINY, cwd=tmp_path)
    trtqat("qat", "--checkpoint", str(runs / "ptq"), "--epochs", "1", "--out",
           str(runs / "qat"), *TINY, cwd=tmp_path)
    out = trtqat("export", "--checkpoint", str(runs / "qat"), "--variant", "int8",
                 "--val-batches", "1", "--out", str(tmp_path / "export"), cwd=tmp_path)
    assert "PASS  TensorRT Q/DQ lint: 0 error(s), 0 warning(s), 7 skipped on purpose" in out
    assert "model.22.dfl.conv/Conv: left in float on purpose" in out
    onnx_file = tmp_path / "export" / "yolov8n-qat-int8.onnx"
    trtqat("build", "--onnx", str(onnx_file), "--out", str(tmp_path / "y.engine"),
           "--shapes", "images:1x3x320x320", "--ortPrepare", "qdq")
    out = trtqat(f"--onnx={onnx_file}", "--shapes=images:1x3x320x320", "--duration=0.2",
                 module="trtqat.cli.exec_cmd")
    assert "Throughput" in out


def test_quantized_yolo_saves_as_an_ultralytics_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    code = f'''
import torch
from trtqat import families
from trtqat.quant.model_ops import collect_stats, compute_amax, quantizers
from trtqat.families.detect.ultralytics import save_ultralytics
family = families.of_model("yolov8n.yaml")
model = family.quantize(family.build("yolov8n.yaml", 3))
collect_stats(model, [torch.rand(1, 3, 64, 64)], progress=False)
compute_amax(model, "max")
from ultralytics import YOLO
yolo = YOLO("yolov8n.yaml")
yolo.model = model
yolo.save("{tmp_path / 'a.pt'}")  # Ultralytics' own writer: no ModelOpt needed
save_ultralytics(model, "{tmp_path / 'b.pt'}")
for name in ("a.pt", "b.pt"):
    back = YOLO("{tmp_path}/" + name)
    qs = dict(quantizers(back.model))
    assert len(qs) == len(dict(quantizers(model))), name
    assert sum(q.amax is not None for q in qs.values()) > 100, name
    back.predict(torch.rand(1, 3, 64, 64), verbose=False)
print("ok")
'''
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "YOLO_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]

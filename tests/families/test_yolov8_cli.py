"""An Ultralytics YOLOv8n from its yaml through the command line (calibrate -> qat -> export,
lint clean -> ORT engine -> trtqat-exec --shapes=images:...), and saved as an Ultralytics
checkpoint that Ultralytics loads. Tiny data and steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import TINY, cli_env, trtqat

pytestmark = pytest.mark.slow


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
    assert sum(q.amax is not None for q in qs.values()) == sum(
        q.amax is not None for _, q in quantizers(model)) > 90, name
    back.predict(torch.rand(1, 3, 64, 64), verbose=False)
print("ok")
'''
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=cli_env(), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]

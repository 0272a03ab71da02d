"""``compare`` on a run that started from a float model (``calibrate --model FILE.py:...``,
no FP32 run): its FP32 and FP16 rows come from the float model the PTQ run recorded."""

from __future__ import annotations

import onnx
import torch

from trtqat.stages.calibrate import CalibrateConfig, calibrate
from trtqat.stages.compare.run import CompareConfig, compare
from trtqat.stages.compare.variants import discover

NET = '''from torch import nn

def make(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, num_classes))
'''


def test_a_run_from_a_float_model_gets_fp32_rows(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(NET)
    root = tmp_path / "runs"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        calibrate(CalibrateConfig(model=f"{src}:make", data="synthetic", image_size=16,
                                  out=str(root / "ptq-max"), method="max", num_batches=2,
                                  progress=False, device="cpu"))
    finally:
        torch.set_num_threads(n)
    variants, _ = discover(root)
    names = [v.name for v in variants]
    assert names == ["fp32", "fp16", "ptq-max"]
    assert all(v.checkpoint == root / "ptq-max" / "best.pt" for v in variants)
    out = tmp_path / "out"
    report = compare(CompareConfig(run=str(root), batch_sizes=(1, 4), duration_s=0.1,
                                   warmup_ms=10, threads=1, calib_batches=1, progress=False,
                                   export_dir=str(out / "export"), out=str(out / "engines"),
                                   variants=("fp32",)), echo=lambda _: None)
    rows = {r["name"]: r for r in report["variants"]}
    assert set(rows) == {"fp32"} and rows["fp32"]["status"] == "ok"
    fp32 = onnx.load(rows["fp32"]["onnx"])
    assert rows["fp32"]["onnx"].endswith("net.make-fp32.onnx")
    assert not any(node.op_type == "QuantizeLinear" for node in fp32.graph.node)
    # PTQ leaves the weights as they were: the float rows score the float model
    assert rows["fp32"]["metrics"]["top1"] is not None

"""ORT engines of float16 graphs: the optimizer that crashes ORT on the exporter's fp16
``nn.MultiheadAttention`` pattern is disabled (only for float16 graphs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import onnx

from trtqat.engines.onnx_io import FP16_UNSAFE_ORT_OPTIMIZERS, ort_disabled_optimizers
from trtqat.export import convert_to_fp16

from .conftest import make_conv_model

ROOT = Path(__file__).resolve().parents[2]


def test_only_float16_graphs_disable_optimizers(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    make_conv_model(path)
    model = onnx.load(path)
    assert ort_disabled_optimizers(model) == []
    assert ort_disabled_optimizers(convert_to_fp16(model)) == list(FP16_UNSAFE_ORT_OPTIMIZERS)


def test_fp16_multihead_attention_engine_builds_and_runs(tmp_path: Path) -> None:
    # in a child process: without the fix ORT 1.32 segfaults, which would end the test run
    script = textwrap.dedent(f"""
        import sys, numpy as np, onnx, torch
        sys.path.insert(0, {str(ROOT)!r})
        from torch import nn
        from trtqat.engines import build_engine, load_engine
        from trtqat.export import convert_to_fp16

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln = nn.LayerNorm(32)
                self.mha = nn.MultiheadAttention(32, 2, batch_first=True)
                self.head = nn.Linear(32, 10)

            def forward(self, x):
                y = self.ln(x)
                return self.head(x + self.mha(y, y, y, need_weights=False)[0])

        torch.manual_seed(0)
        model = Block().eval()
        x = torch.randn(2, 17, 32)
        path = {str(tmp_path / "mha.onnx")!r}
        torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"])
        onnx.save(convert_to_fp16(onnx.load(path)), path)
        engine = build_engine(path, "ort", shapes={{"x": (2, 17, 32)}})
        engine.save({str(tmp_path / "mha.engine")!r})
        loaded = load_engine({str(tmp_path / "mha.engine")!r})
        with loaded.runner() as runner:
            out = runner.infer({{"x": x.numpy()}})["y"]
        ref = model(x).detach().numpy()
        assert np.abs(out.astype(np.float32) - ref).max() < 0.05, np.abs(out - ref).max()
        print("disabled", loaded.header["disabled_optimizers"])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "disabled ['NchwcTransformer']" in proc.stdout

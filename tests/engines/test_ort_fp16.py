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


def _fp16_qdq_concat(path: Path) -> None:
    """x, y (fp16) -> Q/DQ each with one fp16 scale -> Concat -> Q/DQ -> z: the INT8+FP16
    variant's quantized Concat, which ORT 1.32 fuses into a QLinearConcat it then rejects."""
    from onnx import TensorProto, helper

    fp16 = TensorProto.FLOAT16
    inits = [helper.make_tensor("s", fp16, [], [0.05]), helper.make_tensor("zp", TensorProto.INT8,
                                                                          [], [0])]
    nodes = []
    for name in ("x", "y"):
        nodes += [helper.make_node("QuantizeLinear", [name, "s", "zp"], [f"{name}_q"]),
                  helper.make_node("DequantizeLinear", [f"{name}_q", "s", "zp"], [f"{name}_d"])]
    nodes += [helper.make_node("Concat", ["x_d", "y_d"], ["c"], axis=1),
              helper.make_node("QuantizeLinear", ["c", "s", "zp"], ["c_q"]),
              helper.make_node("DequantizeLinear", ["c_q", "s", "zp"], ["z"])]
    graph = helper.make_graph(
        nodes, "concat", [helper.make_tensor_value_info(n, fp16, [1, 4, 8, 8]) for n in "xy"],
        [helper.make_tensor_value_info("z", fp16, [1, 8, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), path)


def test_fp16_quantized_concat_builds_without_ort_qdq_fusions(tmp_path: Path) -> None:
    import numpy as np
    import onnxruntime as ort

    from trtqat.engines import build_engine
    from trtqat.engines.onnx_io import FP16_QDQ_FUSIONS

    path = tmp_path / "concat.onnx"
    _fp16_qdq_concat(path)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:  # the ORT bug the fallback is for: if a later ORT loads it, the fallback stays idle
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                             disabled_optimizers=list(FP16_UNSAFE_ORT_OPTIMIZERS))
        ort_rejects = False
    except Exception:  # noqa: BLE001 - ORT's own exception types
        ort_rejects = True
    engine = build_engine(path, "ort")
    assert (FP16_QDQ_FUSIONS in engine.header["disabled_optimizers"]) == ort_rejects
    rng = np.random.default_rng(0)
    feed = {n: rng.uniform(-3, 3, (1, 4, 8, 8)).astype(np.float16) for n in "xy"}
    with engine.runner() as runner:
        out = runner.infer(feed)["z"]
    step = float(np.float16(0.05))  # the scale as stored
    ref = np.concatenate([np.clip(np.round(feed[n].astype(np.float32) / step), -128, 127)
                          for n in "xy"], 1) * step
    err = np.abs(out.astype(np.float32) - ref)
    assert err.max() <= 1.01 * step  # at most a rounding tie apart
    assert (err > 2e-3).mean() < 0.02, (err > 2e-3).mean()

"""ONNX Runtime must not quantize a float16 or FP8 Q/DQ graph's Conv bias (its level-1
WeightBiasQuantization computes the int32 bias codes in float16, which overflow: a digits
ResNet18's qat-fp8-fp16 engine scored 10% top-1 against 95.8% as written)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.engines.qformat_nets import fp8_conv
from trtqat.engines import build_engine
from trtqat.export.fp16 import convert_to_fp16


def _with_bias(path: Path, int8: bool, float16: bool) -> Path:
    model = onnx.load(str(path))
    model.graph.initializer.append(numpy_helper.from_array(
        np.linspace(-20, 20, 4).astype(np.float32), "bias"))  # / (x_scale * w_scale) > 65504
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    conv.input.append("bias")
    if int8:  # the same graph with INT8 zero points and scales (x / 127 of the amax)
        for t in model.graph.initializer:
            if t.name.endswith("_zp"):
                t.CopyFrom(numpy_helper.from_array(np.zeros(list(t.dims), np.int8), t.name))
            if t.name.endswith("_scale"):
                scale = numpy_helper.to_array(t) * np.float32(448 / 127)
                t.CopyFrom(numpy_helper.from_array(scale.astype(np.float32), t.name))
    if float16:
        model = convert_to_fp16(model, "float32")
    onnx.save(model, str(path))
    return path


def _as_written(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("int8, float16", [(False, False), (False, True), (True, True)])
def test_the_cpu_engine_keeps_the_bias_of_fp8_and_float16_qdq_convs(tmp_path, int8, float16):
    path = _with_bias(fp8_conv(tmp_path / "m.onnx", compressed=not int8, batch="N"), int8,
                      float16)
    model = onnx.load(str(path))
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    engine = build_engine(path, "ort")
    assert "WeightBiasQuantization" in engine.header["disabled_optimizers"]
    with engine.runner() as runner:
        got = runner.infer({"x": x})["y"]
    want = _as_written(model, x)  # float16: the CPU's float16 conv rounds otherwise
    atol = 2e-3 * np.abs(want).max() if float16 else 1e-6  # the bias's int32 rounding: 2e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)

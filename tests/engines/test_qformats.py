"""FP8 and INT4 files on the engine side: what a file holds, and the ONNX Runtime engine
running them on the CPU as written (the INT8 CPU rewrites leave them alone)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtqat.engines import build_engine
from trtqat.engines.ort_qdq import reencode_for_cpu
from trtqat.engines.ort_u8s8 import ENV_OVERRIDE, guard_model
from trtqat.engines.qformats import precision_name, quant_formats

from .conftest import make_conv_model
from .qformat_nets import fp8_conv, int4_matmul, mixed_net
from .test_ort_qdq import make_tiny_qdq

FILES = {
    "fp8": lambda p: fp8_conv(p, batch="N"),
    "fp8-compressed": lambda p: fp8_conv(p, compressed=True, batch="N"),
    "int4": lambda p: int4_matmul(p, batch="N"),
    "mixed": mixed_net,
}
FORMATS = {"fp8": ("fp8",), "fp8-compressed": ("fp8",), "int4": ("int4",),
           "mixed": ("int8", "fp8", "int4")}


def _feeds(model: onnx.ModelProto, n: int = 3) -> list[dict[str, np.ndarray]]:
    x = model.graph.input[0]
    dims = [4] + [d.dim_value for d in x.type.tensor_type.shape.dim[1:]]
    rng = np.random.default_rng(3)
    return [{"x": rng.uniform(-1, 1, dims).astype(np.float32)} for _ in range(n)]


def _as_written(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The file's own maths: ORT with every graph optimisation off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _quantized_inits(model: onnx.ModelProto) -> dict[str, tuple]:
    """FP8 and INT4 initializers by name: (type, shape, values)."""
    kinds = (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.INT4)
    return {t.name: (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
            for t in model.graph.initializer if t.data_type in kinds}


def test_quant_formats_reads_the_qdq_types(tmp_path: Path) -> None:
    for name, make in FILES.items():
        assert quant_formats(onnx.load(str(make(tmp_path / f"{name}.onnx")))) == FORMATS[name]
    assert quant_formats(onnx.load(str(make_conv_model(tmp_path / "float.onnx")))) == ()
    assert quant_formats(make_tiny_qdq()) == ("int8",)
    assert precision_name(("int4",), True) == "int4-fp16"
    assert precision_name((), False) == "fp32" and precision_name(("int8", "fp8"), False) \
        == "int8+fp8"


@pytest.mark.parametrize("name", sorted(FILES))
def test_ort_engine_runs_fp8_and_int4_as_written(name: str, tmp_path: Path, monkeypatch,
                                                 caplog) -> None:
    """Regression (one class: the CPU engine must compute the file's FP8/INT4 maths): the
    u8s8 guard read FP8 zero points as integers (crash), the INT8 re-encoding added INT8
    quantizers around FP8/INT4 ops, ORT dropped a Relu before an FP8 Q, and ORT's
    MatMulNBits quantized INT4 MatMul activations to int8."""
    monkeypatch.setenv(ENV_OVERRIDE, "saturates")  # the x86-without-VNNI path, everywhere
    path = FILES[name](tmp_path / f"{name}.onnx")
    model = onnx.load(str(path))
    feeds = _feeds(model)
    with caplog.at_level(logging.WARNING, logger="trtqat"):
        engine = build_engine(path, "ort", ort_prepare="qdq", calib_feeds=feeds)
    with engine.runner() as runner:
        for feed in feeds:
            want = _as_written(model, feed)
            got = runner.infer(feed)[model.graph.output[0].name]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())
    assert engine.header["quant_formats"] == list(FORMATS[name])
    assert engine.header["precision"] == "+".join(FORMATS[name])
    if "fp8" in FORMATS[name]:
        assert "NOTE FP8 Q/DQ run emulated in float32 by ONNX Runtime on the CPU" in caplog.text
    if FORMATS[name] == ("fp8",):
        assert "runs mostly in float" not in caplog.text  # that warning is INT8's
    if "int4" in FORMATS[name]:
        assert "NOTE INT4 block weights run on ONNX Runtime's MatMulNBits kernel" in caplog.text
        nbits = [n for n in onnx.load_from_string(engine.payload).graph.node
                 if n.op_type == "MatMulNBits"]
        assert nbits and all(a.i == 1 for n in nbits for a in n.attribute
                             if a.name == "accuracy_level")


def test_int8_rewrites_leave_fp8_and_int4_alone(tmp_path: Path) -> None:
    model = onnx.load(str(mixed_net(tmp_path / "mixed.onnx")))
    before = _quantized_inits(model)
    cpu, report = reencode_for_cpu(model, _feeds(model))
    assert report["rewritten"]
    assert _quantized_inits(cpu) == before
    for tensor in ("c2", "f"):  # FP8 conv output, INT4 MatMul input: no INT8 quantizer added
        assert not any(n.op_type == "QuantizeLinear" and n.input[0] == tensor
                       for n in cpu.graph.node)
    float_qdq = onnx.load(str(fp8_conv(tmp_path / "fp8.onnx")))
    guarded, info = guard_model(float_qdq, saturates=True)
    assert _quantized_inits(guarded) == _quantized_inits(float_qdq)
    assert not any(k for k in info.get("uint8_weights", {}) if not k.startswith("kept"))

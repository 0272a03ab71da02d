"""An INT8 (Q/DQ) model that ORT runs mostly in float says so: one WARNING line from
``trtqat build`` and ``trtqat-exec`` (trtqat.engines.ort_nodes)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtqat.cli.exec_cmd import main as exec_main
from trtqat.engines import build_engine, load_engine
from trtqat.engines.ort_nodes import is_qdq_model, mostly_float_note

from .test_cli import FAST, build_cli
from .test_ort_qdq import make_tiny_qdq


def _float_qdq_model(path: Path) -> Path:
    """An activation Q/DQ in front of a float conv, a Sigmoid and a Mul: Q/DQ, yet float."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.float32(0.05), "s"),
             numpy_helper.from_array(np.int8(0), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["g"]),
             helper.make_node("Mul", ["c", "g"], ["y"])]
    graph = helper.make_graph(nodes, "mostly_float", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, path)
    return path


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and "mostly in float" in r.getMessage()]


def test_mostly_float_qdq_build_warns_once(tmp_path, caplog):
    path = _float_qdq_model(tmp_path / "m.onnx")
    assert is_qdq_model(onnx.load(path))
    with caplog.at_level(logging.WARNING):
        assert build_cli(["build", "--onnx", str(path), "--backend", "ort",
                          "--out", str(tmp_path / "m.engine")]) == 0
    lines = _warnings(caplog)
    assert len(lines) == 1
    # ORT fuses Sigmoid * Mul into QuickGelu (x * sigmoid(x)): float, but not a conv/matmul
    assert "0 integer vs 1 float convolution/matmul nodes (most float: Conv 1)" in lines[0]
    # the counts travel with the saved engine (trtqat-exec --loadEngine reads them)
    assert load_engine(tmp_path / "m.engine").header["compute_nodes"]["float"] == 2


def test_loaded_engine_warns_in_trtqat_exec(tmp_path, capsys):
    path = _float_qdq_model(tmp_path / "m.onnx")
    build_engine(path, "ort", threads=1).save(tmp_path / "m.engine")
    assert exec_main([f"--loadEngine={tmp_path / 'm.engine'}", *FAST]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "mostly in float" in line]
    assert len(err) == 1


def test_trtqat_exec_warns_in_one_w_line(tmp_path, capsys):
    path = _float_qdq_model(tmp_path / "m.onnx")
    assert exec_main([f"--onnx={path}", "--backend=ort", *FAST]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "mostly in float" in line]
    assert len(err) == 1 and err[0].startswith("[W] INT8 (Q/DQ) model runs mostly in float")


def test_integer_engine_and_float_model_do_not_warn(tmp_path):
    tiny = tmp_path / "tiny_int8.onnx"
    onnx.save(make_tiny_qdq(), tiny)
    engine = build_engine(tiny, "ort", threads=1)
    summary = engine.header["compute_nodes"]
    assert summary["qdq_source"] and summary["integer"] > summary["float"]
    assert mostly_float_note(engine.header) is None
    from .conftest import make_conv_model

    fp32 = build_engine(make_conv_model(tmp_path / "fp32.onnx"), "ort", threads=1)
    assert fp32.header["compute_nodes"]["qdq_source"] is False
    assert mostly_float_note(fp32.header) is None  # float by design: nothing to warn about


def test_note_weighs_convolutions_and_matmuls_most_frequent_first():
    """Float LayerNorm/GELU/Mul around integer convs (ConvNeXt, transformers) are no reason to
    warn; float convs are, named by count whatever order a loaded sidecar stores them in."""
    ops = {"Add": 13, "Conv": 12, "Erf": 12, "LayerNormalization": 17, "Mul": 38}
    convnext = {"compute_nodes": {"qdq_source": True, "integer": 53, "float": 105,
                                  "integer_ops": {"QLinearConv": 17, "QLinearMatMul": 12,
                                                  "QLinearAdd": 24}, "float_ops": ops}}
    assert mostly_float_note(convnext) is None
    header = {"compute_nodes": {"qdq_source": True, "integer": 13, "float": 40, "integer_ops": {
        "QLinearConv": 3, "QLinearAdd": 10}, "float_ops": {
            "Add": 9, "Conv": 3, "FusedConv": 5, "Gemm": 1, "MatMul": 3, "Relu": 8}}}
    assert ("3 integer vs 12 float convolution/matmul nodes (most float: FusedConv 5, Conv 3, "
            "MatMul 3)") in mostly_float_note(header)

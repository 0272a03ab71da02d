"""Tiny FP8 and INT4 Q/DQ ONNX files built with onnx.helper, for the engine tests.

* :func:`fp8_conv`: Conv with FP8 E4M3 Q/DQ (FLOAT8E4M3FN zero points, opset 19); the
  activation per tensor, the weight per output channel (axis 0), either float + Q/DQ or an
  FP8 initializer + DequantizeLinear only (``compressed``).
* :func:`int4_matmul`: MatMul whose weight is an INT4 initializer -> DequantizeLinear with
  ``axis``/``block_size`` (opset 21), symmetric (no zero point).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

E4M3_MAX = 448.0


def _fp8_tensor(name: str, values: np.ndarray) -> onnx.TensorProto:
    """A FLOAT8E4M3FN initializer holding ``values`` (already representable)."""
    arr = np.asarray(values, np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, arr.shape, arr.ravel().tolist())


def fp8_conv(path: Path, compressed: bool = False, seed: int = 0, batch: int | str = 1,
             opset: int = 19) -> Path:
    """x[b,3,8,8] -> Q/DQ(fp8, per tensor) -> Conv(w: fp8 per channel) -> Relu -> y."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w_scale = (np.abs(w.reshape(4, -1)).max(1) / E4M3_MAX).astype(np.float32)
    x_scale = np.float32(3.0 / E4M3_MAX)
    inits = [numpy_helper.from_array(x_scale, "x_scale"), _fp8_tensor("x_zp", np.zeros(())),
             numpy_helper.from_array(w_scale, "w_scale"), _fp8_tensor("w_zp", np.zeros(4))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xdq"],
                              name="dq_x")]
    if compressed:
        codes = (w / w_scale[:, None, None, None]).astype(ml_dtypes.float8_e4m3fn)
        inits.append(_fp8_tensor("w_fp8", codes.astype(np.float32)))
        nodes.append(helper.make_node("DequantizeLinear", ["w_fp8", "w_scale", "w_zp"],
                                      ["wdq"], name="dq_w", axis=0))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
        nodes += [helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zp"], ["wq"],
                                   name="q_w", axis=0),
                  helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wdq"],
                                   name="dq_w", axis=0)]
    nodes += [helper.make_node("Conv", ["xdq", "wdq"], ["c"], name="conv", pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "fp8_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def int4_weight(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT4 codes and per-block scales of ``w[K, N]``, blocks along K (axis 0)."""
    k, n = w.shape
    blocks = w.reshape(k // block, block, n)
    scale = (np.abs(blocks).max(1) / 7.0).astype(np.float32)  # [K/block, N]
    codes = np.clip(np.rint(blocks / scale[:, None, :]), -8, 7).astype(np.int8)
    return codes.reshape(k, n), scale


def int4_matmul(path: Path, k: int = 64, n: int = 16, block: int = 32, seed: int = 0,
                batch: int | str = 2, float16: bool = False) -> Path:
    """x[b,K] @ DQ(w_int4[K,N], scale[K/block,N], axis=0, block_size) + bias -> y[b,N]."""
    rng = np.random.default_rng(seed)
    codes, scale = int4_weight(rng.standard_normal((k, n)).astype(np.float32), block)
    ftype = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
    fnp = np.float16 if float16 else np.float32
    inits = [helper.make_tensor("w_int4", TensorProto.INT4, [k, n], codes.ravel().tolist()),
             numpy_helper.from_array(scale.astype(fnp), "w_scale"),
             numpy_helper.from_array(rng.standard_normal(n).astype(fnp), "bias")]
    nodes = [helper.make_node("DequantizeLinear", ["w_int4", "w_scale"], ["w"], name="dq_w",
                              axis=0, block_size=block),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "bias"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "int4_matmul",
                              [helper.make_tensor_value_info("x", ftype, [batch, k])],
                              [helper.make_tensor_value_info("y", ftype, [batch, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mixed_net(path: Path, seed: int = 0) -> Path:
    """INT8, FP8 and INT4 in one graph, so the CPU INT8 rewrites meet the other formats:
    x[b,3,8,8] -> Q/DQ int8 -> Conv(DQ int8 W, per channel) -> Relu -> Q/DQ fp8 ->
    Conv(DQ fp8 W, compressed) -> Flatten -> MatMul(DQ int4 W, block 32) -> y[b,6]."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    s1 = (np.abs(w1.reshape(8, -1)).max(1) / 127).astype(np.float32)
    w2 = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3
    s2 = (np.abs(w2.reshape(4, -1)).max(1) / E4M3_MAX).astype(np.float32)
    codes2 = (w2 / s2[:, None, None, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    codes3, s3 = int4_weight(rng.standard_normal((256, 6)).astype(np.float32), 32)
    inits = [
        numpy_helper.from_array(np.float32(1.0 / 127), "x_s"),
        numpy_helper.from_array(np.int8(0), "x_z"),
        numpy_helper.from_array(np.rint(w1 / s1[:, None, None, None]).astype(np.int8), "w1_q"),
        numpy_helper.from_array(s1, "w1_s"), numpy_helper.from_array(np.zeros(8, np.int8), "w1_z"),
        numpy_helper.from_array(np.float32(6.0 / E4M3_MAX), "h_s"), _fp8_tensor("h_z", np.zeros(())),
        _fp8_tensor("w2_fp8", codes2), numpy_helper.from_array(s2, "w2_s"),
        _fp8_tensor("w2_z", np.zeros(4)),
        helper.make_tensor("w3_int4", TensorProto.INT4, [256, 6], codes3.ravel().tolist()),
        numpy_helper.from_array(s3, "w3_s")]
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             node("DequantizeLinear", ["w1_q", "w1_s", "w1_z"], ["w1"], axis=0),
             node("Conv", ["xd", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             node("Relu", ["c1"], ["r1"]),
             node("QuantizeLinear", ["r1", "h_s", "h_z"], ["hq"]),
             node("DequantizeLinear", ["hq", "h_s", "h_z"], ["hd"]),
             node("DequantizeLinear", ["w2_fp8", "w2_s", "w2_z"], ["w2"], axis=0),
             node("Conv", ["hd", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             node("Flatten", ["c2"], ["f"]),
             node("DequantizeLinear", ["w3_int4", "w3_s"], ["w3"], axis=0, block_size=32),
             node("MatMul", ["f", "w3"], ["y"])]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path

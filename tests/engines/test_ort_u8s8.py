"""ORT's u8 x s8 integer kernels saturate on x86 CPUs without VNNI (trtqat.engines.ort_u8s8):
the probe, the exact uint8-weight rewrite, and the ORT engine build that applies it."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.engines.hints import HINTS_KEY, ORT_PASSES, EngineHints
from trtqat.engines.ort_qdq import cpu_session, reencode_for_cpu
from trtqat.engines.ort_qdq_graph import Graph
from trtqat.engines.ort_u8s8 import (
    ENV_OVERRIDE,
    cpu_has_vnni,
    exact_weights,
    guard_model,
    u8s8_saturates,
)

C = 16


def _qdq_net(signed_dtype=np.uint8, matmul: bool = True) -> onnx.ModelProto:
    """x -> Q/DQ (signed: uint8 zp 128) -> dense Conv -> Relu -> Q/DQ (uint8 zp 0) -> dense
    Conv and depthwise Conv -> Add -> Flatten -> Q/DQ -> Transpose'd MatMul weight; every
    weight int8 with many same-sign +-127 neighbours (what saturates vpmaddubsw)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def qdq(x, scale, zp, dtype):
        s, z = init(f"{x}_s", np.float32(scale)), init(f"{x}_z", np.array(zp, dtype))
        nodes.append(helper.make_node("QuantizeLinear", [x, s, z], [f"{x}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{x}_q", s, z], [f"{x}_dq"]))
        return f"{x}_dq"

    def weight(name, shape, axis=0):
        w = np.where(rng.random(shape) < 0.8, 127, -127) * rng.choice([1, -1], (shape[0],) + (
            1,) * (len(shape) - 1))
        w = w.astype(np.int8)
        n = shape[axis]
        s, z = init(f"{name}_s", np.full(n, 0.002, np.float32)), init(f"{name}_z", np.zeros(n, np.int8))
        nodes.append(helper.make_node("DequantizeLinear", [init(name, w), s, z], [f"{name}_dq"],
                                      axis=axis))
        return f"{name}_dq"

    zp = 128 if signed_dtype == np.uint8 else 0
    x = qdq("x", 0.05, zp, signed_dtype)
    nodes.append(helper.make_node("Conv", [x, weight("w1", (C, C, 3, 3))], ["c1"], pads=[1] * 4))
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"]))
    r = qdq("r1", 0.5, 0, signed_dtype)  # post-ReLU: uint8 or TensorRT's int8, zero-point 0
    nodes.append(helper.make_node("Conv", [r, weight("w2", (C, C, 1, 1))], ["c2"]))
    nodes.append(helper.make_node("Conv", [r, weight("w3", (C, 1, 3, 3))], ["c3"], pads=[1] * 4,
                                  group=C))
    nodes.append(helper.make_node("Add", ["c2", "c3"], ["sum"]))
    nodes.append(helper.make_node("Flatten", ["sum"], ["flat"]))
    if matmul:
        f = qdq("flat", 0.5, zp, signed_dtype)
        wt = weight("w4", (4, C * 4 * 4))
        nodes.append(helper.make_node("Transpose", [wt], ["w4t"], perm=[1, 0]))
        nodes.append(helper.make_node("MatMul", [f, "w4t"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["flat"], ["y"]))
    graph = helper.make_graph(nodes, "u8s8", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [None, C, 4, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [None, 4 if matmul else C * 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def _feed() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).uniform(-6, 6, (8, C, 4, 4)).astype(np.float32)}


def _weight_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    """Element type of the constant each weight DequantizeLinear reads, by its output."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.output[0]: inits[n.input[0]].dtype.name for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits}


def test_probe_matches_the_cpu_flags(monkeypatch):
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    saturates = u8s8_saturates()
    assert isinstance(saturates, bool)
    vnni = cpu_has_vnni()
    if vnni:  # vpdpbusd accumulates in int32
        assert not saturates
    flags = open("/proc/cpuinfo").read() if vnni is not None else ""
    if vnni is False and " avx2" in flags:  # x86 with AVX2 only: vpmaddubsw saturates
        assert saturates
    monkeypatch.setenv(ENV_OVERRIDE, "exact")
    assert u8s8_saturates() is False
    monkeypatch.setenv(ENV_OVERRIDE, "saturates")
    assert u8s8_saturates() is True


def test_exact_weights_rewrites_the_weights_that_can_saturate():
    model = _qdq_net()
    g = Graph(onnx.load_from_string(model.SerializeToString()))
    counts = exact_weights(g, seven_bit={"r1_q"})
    dtypes = _weight_dtypes(g.model)
    assert dtypes["w1_dq"] == "uint8"  # dense conv on a signed (zero-point 128) activation
    assert dtypes["w2_dq"] == "int8"  # its input has at most 127 steps: cannot saturate
    assert dtypes["w3_dq"] == "int8"  # depthwise: ORT's direct kernel does not saturate
    assert dtypes["w4_dq"] == "uint8"  # MatMul weight behind a Transpose
    assert counts == {"Conv": 1, "MatMul": 1, "kept_int8_7bit_input": 1,
                      "kept_int8_depthwise": 1}
    feed = _feed()
    want = cpu_session(model, 1, "basic").run(None, feed)[0]  # Q/DQ as written, float maths
    got = cpu_session(g.model, 1, "all").run(None, feed)[0]  # integer kernels
    # same integers: only the float rounding of the output dequantization may differ
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    if u8s8_saturates():  # what the rewrite is for: ORT's own fusion is off by far more
        raw = cpu_session(model, 1, "all").run(None, feed)[0]
        assert np.abs(raw - want).max() > 1.0


def test_reencoding_records_the_choice_and_stays_exact():
    model = _qdq_net(np.int8, matmul=False)  # TensorRT style: int8 activations, zero-point 0
    feed = _feed()
    want = cpu_session(model, 1, "basic").run(None, feed)[0]
    float_convs = copy.deepcopy(model)  # the 1x1 conv feeding the float Add stays a Conv
    float_convs.metadata_props.add(key=HINTS_KEY, value=EngineHints(ort_rewrites=tuple(
        p for p in ORT_PASSES if p != "float_output_convs")).to_json())
    new, report = reencode_for_cpu(float_convs, None, count_nodes=False, u8s8_exact=False)
    assert report["cpu"]["u8s8_saturates"] is True
    assert report["cpu"]["uint8_weights"] == {"Conv": 1, "kept_int8_7bit_input": 1,
                                              "kept_int8_depthwise": 1}
    np.testing.assert_allclose(cpu_session(new, 1).run(None, feed)[0], want, rtol=1e-5,
                               atol=1e-3)
    new, report = reencode_for_cpu(model, None, count_nodes=False, u8s8_exact=False)
    assert report["passes"]["float_output_convs_integer"] == 1  # uint8 weights of its own
    assert report["cpu"]["uint8_weights"] == {"Conv": 1, "kept_int8_depthwise": 1}
    np.testing.assert_allclose(cpu_session(new, 1).run(None, feed)[0], want, rtol=1e-5,
                               atol=1e-3)
    same, report = reencode_for_cpu(model, None, count_nodes=False, u8s8_exact=True)
    assert report["cpu"]["u8s8_saturates"] is False and "uint8_weights" not in report["cpu"]
    assert set(_weight_dtypes(same).values()) == {"int8"}


def test_guard_leaves_reencoded_and_exact_cases_alone():
    model = _qdq_net(np.int8)
    assert guard_model(model, saturates=False)[0] is model
    guarded, info = guard_model(model, saturates=True)
    assert info["uint8_weights"]["Conv"] == 2  # no 7-bit knowledge: both dense convs
    assert _weight_dtypes(guarded)["w3_dq"] == "int8"
    prepared = onnx.load_from_string(model.SerializeToString())
    entry = prepared.metadata_props.add()
    entry.key, entry.value = "trtqat.cpu_reencode", "{}"
    assert guard_model(prepared, saturates=True)[0] is prepared


def test_ort_engine_without_reencoding_is_exact(tmp_path, monkeypatch):
    from trtqat.engines import build_engine

    path = tmp_path / "net.onnx"
    onnx.save(_qdq_net(np.int8), path)
    feed = _feed()
    want = cpu_session(onnx.load(path), 1, "basic").run(None, feed)[0]
    monkeypatch.setenv(ENV_OVERRIDE, "saturates")
    engine = build_engine(path, "ort", threads=1, ort_prepare="none")
    assert engine.header["cpu_int8"]["u8s8_saturates"] is True
    assert engine.header["cpu_int8"]["uint8_weights"]["MatMul"] == 1
    with engine.runner(threads=1) as runner:
        got = runner.infer(feed)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("mode", ["exact", "saturates"])
def test_engine_header_says_what_the_cpu_does(tmp_path, monkeypatch, mode):
    from trtqat.engines import build_engine, load_engine

    path = tmp_path / "net.onnx"
    onnx.save(_qdq_net(np.int8), path)
    monkeypatch.setenv(ENV_OVERRIDE, mode)
    engine = build_engine(path, "ort", threads=1, ort_prepare="none")
    saved = load_engine(engine.save(tmp_path / "net.engine"))
    assert saved.header["cpu_int8"]["u8s8_saturates"] is (mode == "saturates")


def test_guard_rewrites_explicit_integer_ops():
    """QOperator-format models (QLinearConv with int8 weights) get uint8 weights too."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 16, 6, 6)).astype(np.uint8)
    w = np.where(rng.random((8, 16, 3, 3)) < 0.8, 127, -127).astype(np.int8)
    inits = [numpy_helper.from_array(v, n) for v, n in [
        (w, "w"), (np.uint8(128), "xz"), (np.int8(0), "wz"), (np.float32(1), "xs"),
        (np.float32(1), "ws"), (np.float32(4000), "ys"), (np.uint8(128), "yz")]]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "qlinear", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, x.shape)], [helper.make_tensor_value_info(
            "y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    guarded, info = guard_model(model, saturates=True)
    assert info["uint8_weights"] == {"QLinearConv": 1}
    acc = np.zeros((1, 8, 6, 6))
    padded = np.pad(x.astype(np.float64) - 128, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for i in range(6):
        for j in range(6):
            acc[0, :, i, j] = np.tensordot(w.astype(np.float64), padded[0, :, i:i + 3, j:j + 3],
                                           axes=([1, 2, 3], [0, 1, 2]))
    want = np.clip(np.rint(acc / 4000) + 128, 0, 255)
    got = cpu_session(guarded, 1).run(None, {"x": x})[0]
    assert np.abs(got.astype(int) - want).max() <= 1  # the same integers, up to rounding ties


@pytest.mark.parametrize("kernels", ["exact", "fast"])
def test_cpu_int8_flag_picks_the_kernels(tmp_path, monkeypatch, capsys, kernels):
    """``trtqat-exec --cpuInt8=fast`` keeps int8 weights (ORT's saturating kernels, as its own
    quantize_static models run) and the header says so; exact (the default) is guarded."""
    import json

    from trtqat.cli.exec_cmd import main

    path = tmp_path / "net.onnx"
    onnx.save(_qdq_net(np.int8), path)
    monkeypatch.setenv(ENV_OVERRIDE, "saturates")
    saved = tmp_path / "net.engine"
    rc = main([f"--onnx={path}", "--shapes=x:2x16x4x4", f"--cpuInt8={kernels}",
               "--ortPrepare=none", f"--saveEngine={saved}", "--duration=0.1", "--warmUp=10",
               "--iterations=2", "--threads=1"])
    assert rc == 0
    header = json.loads((tmp_path / "net.engine.json").read_text())["cpu_int8"]
    assert header["kernels"] == kernels and header["u8s8_saturates"] is True
    dtypes = set(_weight_dtypes(onnx.load(saved)).values())
    if kernels == "fast":
        assert "uint8_weights" not in header and dtypes == {"int8"}
        assert "--cpuInt8=fast: this CPU's uint8 x int8 kernels saturate" in capsys.readouterr().err
    else:
        assert header["uint8_weights"]["MatMul"] == 1 and "uint8" in dtypes


def test_cpu_int8_flag_refuses_other_values(tmp_path, capsys):
    from trtqat.cli.exec_cmd import main

    path = tmp_path / "net.onnx"
    onnx.save(_qdq_net(np.int8), path)
    with pytest.raises(SystemExit) as stop:
        main([f"--onnx={path}", "--cpuInt8=quick"])
    assert stop.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cpuInt8" in err[0] and "exact" in err[0]

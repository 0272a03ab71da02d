"""ORT engines that must run: a re-encoded pattern outside what ORT's integer kernel accepts
stays in float (QLinearGlobalAveragePool's scale range), every build runs one inference
before handing the engine out, and ORT's runtime failures are one-line errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtqat.engines import EngineBuildError, EngineRunError, build_engine, load_engine
from trtqat.engines.ort_qdq import cpu_session
from trtqat.engines.ort_qdq_pool import gap_scales_ok

from .qdq_nets import QDQNet, feeds, make


def _net(net: QDQNet, x: str) -> str:
    return net.head(net.node("Relu", [net.conv(x, 3, 8)]), 8)


def _vanishing_head(tmp_path) -> str:
    """A Q/DQ net whose classifier input quantizer was calibrated on features that all but
    vanished (scale 7e-11, as a MobileNetV2 calibrated on synthetic data has): the pool's
    requantization x_scale / (y_scale * H * W) is far above ORT's limit of 256."""
    _, model = make(_net)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    dq = next(n for n in model.graph.node if n.output[0] == gemm.input[0])
    for init in model.graph.initializer:
        if init.name == dq.input[1]:
            init.CopyFrom(numpy_helper.from_array(np.float32(7e-11), init.name))
    path = tmp_path / "vanishing.onnx"
    onnx.save(model, path)
    return str(path)


def test_gap_scale_range_matches_ort():
    """The limits of MLAS's QLinearGlobalAveragePool: 2**-32 <= x / (y * N) < 256, N < 2**24."""
    assert gap_scales_ok(0.02, 0.001, 49)  # ratio 0.41
    assert not gap_scales_ok(0.0235, 7e-11, 4)  # the MobileNetV2 head
    assert not gap_scales_ok(1.0, 1.0, 1 << 24)
    assert not gap_scales_ok(1e-12, 1.0, 256)
    assert not gap_scales_ok(1.0, float("nan"), 4) and not gap_scales_ok(1.0, 0.0, 4)
    assert gap_scales_ok(0.02, 0.001, None) and not gap_scales_ok(300.0, 1.0, None)


def test_pool_out_of_kernel_range_runs_in_float(tmp_path):
    path = _vanishing_head(tmp_path)
    engine = build_engine(path, "ort")  # no calibration inputs: synthetic first inference
    assert engine.header["reencoding"]["pools_in_float"]
    assert engine.header["compute_nodes"]["float_ops"] == {"ReduceMean": 1}
    assert engine.header["first_inference"].startswith("synthetic")
    feed = feeds(n=1, batch=2)[0]
    want = cpu_session(onnx.load(path), 1, "basic").run(None, feed)[0]
    with engine.runner() as runner:
        got = runner.infer(feed)
    np.testing.assert_allclose(next(iter(got.values())), want, atol=1e-3)


def test_engine_that_cannot_run_is_refused_and_runtime_errors_are_one_line(
        tmp_path, monkeypatch, capsys):
    """Without the float fallback the engine fails its agreement check (on calibration or
    synthetic inputs), else its first inference: the build says so in one line; an engine
    built past both fails trtexec-style runs in one line."""
    from trtqat.cli.exec_cmd import main
    from trtqat.engines import ort, ort_qdq

    path = _vanishing_head(tmp_path)
    monkeypatch.setattr(ort_qdq, "float_pools_out_of_range", lambda g: [])
    for calib, says in ((None, "check inputs"), (feeds(n=1, batch=2), "check inputs"),
                        ("unchecked", "fails its first inference")):
        if calib == "unchecked":
            monkeypatch.setattr(ort_qdq, "check_agreement", lambda *args: {})
            calib = None
        with pytest.raises(EngineBuildError) as info:
            build_engine(path, "ort", calib_feeds=calib)
        message = str(info.value)
        assert says in message and "QLinearGlobalAveragePool" in message
        assert "--ortPrepare=none" in message and "\n" not in message

    monkeypatch.setattr(ort, "first_inference", lambda *args: "not run")
    engine = build_engine(path, "ort")
    with engine.runner() as runner, pytest.raises(EngineRunError) as info:
        runner.infer(feeds(n=1, batch=1)[0])
    assert "QLinearGlobalAveragePool" in str(info.value) and "\n" not in str(info.value)
    saved = engine.save(tmp_path / "broken.engine")
    capsys.readouterr()
    assert main([f"--loadEngine={saved}", "--backend=ort", "--duration=0",
                 "--warmUp=0", "--iterations=1"]) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert "failed running the engine" in err and "QLinearGlobalAveragePool" in err
    assert load_engine(saved).header["first_inference"] == "not run"


def test_agreement_check_fails_on_non_finite_outputs():
    """NaN outputs of the re-encoded graph fail the check, whatever top-1 says."""
    from onnx import TensorProto, helper

    from trtqat.engines.ort_qdq import AgreementError, check_agreement

    def model(op: str) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=8)

    feed = [{"x": np.array([[-1, 2, 3, 4], [4, 3, 2, -1]], np.float32)}]
    assert check_agreement(model("Identity"), model("Identity"), feed)["top1_agreement"] == 1
    with pytest.raises(AgreementError, match="non-finite outputs"):
        check_agreement(model("Identity"), model("Sqrt"), feed)

"""The faithful CPU re-encoding: no quantizer the exported graph did not have, built when the
fully integer one fails the agreement check (trtqat.engines.ort_qdq.prepare_model)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtqat.engines import ort_qdq
from trtqat.engines.ort_qdq import AgreementError, cpu_session, reencode_for_cpu
from trtqat.engines.ort_u8s8 import ENV_OVERRIDE

from .qdq_nets import feeds, make
from .test_ort_mobile import mobilenet_v2

MOVED = ("CPU re-encoding moved the outputs too far: top-1 agreement 50.00% < 99.00% on 24 "
         "inputs (max abs diff 1.0); build without CPU re-encoding or calibrate on "
         "representative inputs")


def _qdq_ops(model: onnx.ModelProto) -> int:
    """Activation quantizers (weights may be stored quantized)."""
    consts = {t.name for t in model.graph.initializer}
    return sum(n.op_type == "QuantizeLinear" and n.input[0] not in consts
               for n in model.graph.node)


def test_faithful_adds_no_quantizer_and_stays_closer():
    """The residual Add of two float conv outputs: the full re-encoding quantizes both for
    ORT's QLinearAdd (one more rounding each); the faithful one keeps the Add in float."""
    _, qdq_model = make(mobilenet_v2)
    feed = feeds(n=1, batch=32, seed=5)[0]
    want = cpu_session(qdq_model, 1, "basic").run(None, feed)[0]
    full, full_report = reencode_for_cpu(qdq_model, feeds(), threads=1, count_nodes=False,
                                         min_top1=0.0)
    assert "faithful" not in full_report
    faithful, report = reencode_for_cpu(qdq_model, feeds(), threads=1, faithful=True)
    assert report["faithful"] is True and "output_quantizers_added" not in report["passes"]
    assert full_report["passes"]["output_quantizers_added"]["calibrated"] >= 1
    assert _qdq_ops(faithful) <= _qdq_ops(qdq_model) < _qdq_ops(full)
    after = report["compute_nodes"]["after"]
    assert "QLinearAdd" not in after["integer"] and after["float"].get("Add", 0) >= 1
    assert after["integer"]["QLinearConv"] >= 5  # the convs still run on integer kernels
    scale = float(np.abs(want).max())
    err_full = float(np.abs(cpu_session(full, 1).run(None, feed)[0] - want).max())
    err = float(np.abs(cpu_session(faithful, 1).run(None, feed)[0] - want).max())
    assert err < err_full and err <= 1e-3 * scale


def _fail_full(monkeypatch, faithful_fails: bool = False) -> list[bool]:
    """reencode_for_cpu that fails the agreement check unless faithful (then too if asked)."""
    real, calls = ort_qdq.reencode_for_cpu, []

    def fake(model, calib, **kwargs):
        calls.append(bool(kwargs.get("faithful")))
        if not kwargs.get("faithful") or faithful_fails:
            raise AgreementError(MOVED)
        return real(model, calib, **kwargs)

    monkeypatch.setattr(ort_qdq, "reencode_for_cpu", fake)
    return calls


def test_build_falls_back_to_the_faithful_reencoding(tmp_path, monkeypatch, caplog):
    from trtqat.engines import build_engine

    _, qdq_model = make(mobilenet_v2)
    path = tmp_path / "net.onnx"
    onnx.save(qdq_model, path)
    calls = _fail_full(monkeypatch)
    engine = build_engine(path, "ort", threads=1, calib_feeds=feeds())
    assert calls == [False, True]
    meta = {p.key: p.value for p in onnx.load_from_string(engine.payload).metadata_props}
    report = json.loads(meta["trtqat.cpu_reencode"])
    assert report["faithful"] is True and report["full_reencoding"] == MOVED
    found = engine.header["reencoding"]
    assert (found["kind"], found["why"]) == ("faithful", MOVED)
    verdict = found["verdict"]  # what the kind depended on
    assert (verdict["inputs"], verdict["samples"], verdict["source"]) == (3, 24, "calib_feeds")
    assert (verdict["metric"], verdict["threshold"], verdict["threads"]) == ("top1", 0.99, 1)
    assert verdict["faithful"] >= 0.99 and verdict["integer"] is None  # (the fake's error)
    assert report["agreement"]["top1_agreement"] >= 0.99
    warned = [r.getMessage() for r in caplog.records if "faithful" in r.getMessage()]
    assert len(warned) == 1 and "top-1 agreement 50.00% < 99.00%" in warned[0]
    feed = feeds(n=1, batch=4, seed=5)[0]
    with engine.runner(threads=1) as runner:
        got = next(iter(runner.infer(feed).values()))
    want = cpu_session(qdq_model, 1, "basic").run(None, feed)[0]
    np.testing.assert_allclose(got, want, atol=1e-3 * float(np.abs(want).max()))


@pytest.mark.parametrize("fast", [False, True])
def test_build_fails_when_the_faithful_one_moves_too(tmp_path, monkeypatch, fast):
    from trtqat.engines import build_engine

    _, qdq_model = make(mobilenet_v2)
    path = tmp_path / "net.onnx"
    onnx.save(qdq_model, path)
    monkeypatch.setenv(ENV_OVERRIDE, "saturates")
    calls = _fail_full(monkeypatch, faithful_fails=True)
    with pytest.raises(AgreementError) as err:
        build_engine(path, "ort", threads=1, calib_feeds=feeds(), u8s8_guard=not fast)
    assert calls == [False, True]
    assert ("build with --cpuInt8=exact" in str(err.value)) is fast
    assert str(err.value).startswith(  # both figures (here the fake's), in one line
        "CPU re-encoding moved the outputs too far on calibration inputs: fully integer graph: "
        "top-1 agreement 50.00% < 99.00% on 24 inputs (max abs diff 1.0); faithful graph: "
        "top-1 agreement 50.00% < 99.00% on 24 inputs (max abs diff 1.0); build with "
        "--ortPrepare=none")


def test_without_calibration_inputs_synthetic_inputs_check_it(tmp_path, caplog):
    """No calibration inputs: the fully integer re-encoding (ranges from neighbouring
    quantizers), checked on seeded synthetic inputs in the input quantizer's range, which
    the log and the engine header name."""
    from trtqat.engines import build_engine

    _, qdq_model = make(mobilenet_v2)
    path = tmp_path / "net.onnx"
    onnx.save(qdq_model, path)
    with caplog.at_level("INFO", logger="trtqat.engines.ort_qdq"):
        engine = build_engine(path, "ort", threads=1)
    meta = {p.key: p.value for p in onnx.load_from_string(engine.payload).metadata_props}
    report = json.loads(meta["trtqat.cpu_reencode"])
    assert "faithful" not in report and report["agreement"]["metric"] == "top1"
    assert report["passes"]["output_quantizers_added"]["calibrated"] == 0  # nothing calibrated
    assert engine.header["reencoding"]["kind"] == "integer"
    verdict = engine.header["reencoding"]["verdict"]
    assert (verdict["inputs"], verdict["samples"], verdict["source"]) == (2, 16, "synthetic")
    assert verdict["integer"] >= 0.99 and verdict["threshold"] == 0.99
    assert 0 < verdict["decisive"] <= 16 and verdict["centered_cosine"]["integer"] >= 0.98
    x = verdict["synthetic"]["x"]
    scale = next(numpy_helper.to_array(t) for t in qdq_model.graph.initializer
                 if t.name == qdq_model.graph.node[0].input[1])  # the input quantizer's
    assert x["shape"] == [8, 3, 16, 16] and x["dtype"] == "float32"
    assert f"[{-128 * float(scale):.4g}, {127 * float(scale):.4g}]" in x["values"]
    logged = [r.getMessage() for r in caplog.records if "synthetic" in r.getMessage()]
    assert logged and "x float32 8x3x16x16 normal in the input quantizer's range" in logged[0]
    assert engine.header["compute_nodes"]["integer"]
    again = build_engine(path, "ort", threads=1)  # seeded: the same check, the same bytes
    assert again.payload == engine.payload


def test_compare_notes_the_faithful_engine():
    from types import SimpleNamespace

    from trtqat.stages.compare.report import VariantResult
    from trtqat.stages.compare.run import _noted

    result = VariantResult("ptq-max-int8", "int8")
    _noted(SimpleNamespace(header={"reencoding": {"kind": "integer"}}), result)
    assert result.notes == []
    _noted(SimpleNamespace(header={"reencoding": {"kind": "faithful", "why": MOVED}}), result)
    assert len(result.notes) == 1 and "faithful re-encoding" in result.notes[0]
    verdict = {"inputs": 3, "samples": 24, "metric": "top1", "threshold": 0.99, "threads": 1,
               "integer": 0.5, "faithful": 1.0}
    _noted(SimpleNamespace(header={"reencoding": {"kind": "faithful", "why": MOVED,
                                                  "verdict": verdict}}), result)
    assert result.notes[-1] == (
        "ORT re-encoding verdict: faithful graph; top1 agreement of the integer graph 50.00%, "
        "faithful 100.00%, threshold 99.00%, on 24 samples of 3 calibration batches (ORT on 1 "
        "thread)")

"""The ORT build's agreement check without calibration inputs (trtqat.engines.ort_check):
the metric comes from the file's family, synthetic inputs catch a broken re-encoding, and a
build whose integer and faithful graphs both fail says so with both figures."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.engines import build_engine, ort_qdq
from trtqat.engines.ort_check import check_metric, input_ranges, synthetic_check_feeds
from trtqat.engines.ort_inspect import AgreementError, check_agreement
from trtqat.errors import TrtqatError

from .qdq_nets import make
from .test_ort_mobile import mobilenet_v2


def _stamped(model: onnx.ModelProto, **meta: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for key, value in meta.items():
        entry = out.metadata_props.add()
        entry.key, entry.value = f"trtqat.{key}", value
    return out


def _identity(shape: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "id",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_the_metric_follows_the_files_family_else_its_output():
    logits, maps = _identity(["n", 6]), _identity(["n", 4, 8, 8])
    assert check_metric(_stamped(maps, family="cnn")) == "top1"
    assert check_metric(_stamped(logits, family="encoder")) == "cosine"
    assert check_metric(_stamped(maps, family="detect")) == "detection"
    assert check_metric(_stamped(logits, task="sentence-embedding")) == "cosine"
    # a Hugging Face encoder's classification head (its export stamps the task): top-1
    assert check_metric(_stamped(logits, family="encoder", task="classification")) == "top1"
    assert check_metric(_stamped(maps, family="encoder", task="feature-extraction")) == "cosine"
    assert check_metric(logits) == "top1"  # no metadata: [batch, classes] is a classifier
    assert check_metric(maps) == "cosine"  # feature maps have no top-1
    assert check_metric(logits, embedding=True) == "cosine"
    # the family's metric is the one check_agreement applies
    feeds = [{"x": np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)}]
    encoder = _stamped(logits, family="encoder")
    assert check_agreement(encoder, encoder, feeds, threads=1)["metric"] == "cosine"
    assert check_agreement(logits, logits, feeds, threads=1)["metric"] == "top1"


def test_synthetic_inputs_are_seeded_and_exercise_the_input_quantizers_range():
    _, qdq_model = make(mobilenet_v2)
    feeds, described = synthetic_check_feeds(qdq_model)
    again, _ = synthetic_check_feeds(qdq_model)
    assert len(feeds) == described["feeds"] == 2 and feeds[0]["x"].shape == (8, 3, 16, 16)
    np.testing.assert_array_equal(feeds[1]["x"], again[1]["x"])
    lo, hi = input_ranges(qdq_model)["x"]  # the input quantizer's grid: [-128, 127] x scale
    assert f"[{lo:.4g}, {hi:.4g}]" in described["x"]["values"] and lo == pytest.approx(
        -128 / 127 * hi)
    x = np.concatenate([f["x"] for f in feeds])
    assert lo <= x.min() and x.max() <= hi and x.std() > 0.25 * hi  # the grid, well used


def _corrupt_weight_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken re-encoding: the weight pre-quantization (run by the integer and the
    faithful re-encodings alike) gives one conv's dequantizer wrong per-channel scales."""
    real = ort_qdq.prequantize_weights

    def broken(g):
        found = real(g)
        for node in g.graph.node:
            init = g.inits.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
            if init is not None and len(init.dims) == 4 and init.dims[1] > 1:
                scale = numpy_helper.to_array(g.inits[node.input[1]])
                wrong = scale * np.random.default_rng(0).uniform(0.1, 10, scale.shape)
                g.inits[node.input[1]].CopyFrom(
                    numpy_helper.from_array(wrong.astype(np.float32), node.input[1]))
                break
        return found

    monkeypatch.setattr(ort_qdq, "prequantize_weights", broken)


def test_a_broken_reencoding_is_caught_without_calibration_inputs(tmp_path, monkeypatch):
    """Both graphs fail on the synthetic inputs: one line with both figures, the folder
    holding both graphs, and the way out."""
    _, qdq_model = make(mobilenet_v2)
    path = tmp_path / "net.onnx"
    onnx.save(qdq_model, path)
    _corrupt_weight_scales(monkeypatch)
    with pytest.raises(AgreementError) as info:
        build_engine(path, "ort", threads=1)
    message = str(info.value)
    assert isinstance(info.value, TrtqatError) and "\n" not in message
    found = re.search(r"on synthetic inputs \(no calibration inputs given\): fully integer "
                      r"graph: top-1 agreement ([\d.]+)%, centered cosine ([-\d.]+); faithful "
                      r"graph: top-1 agreement ([\d.]+)%, centered cosine ([-\d.]+) \(needs "
                      r"top-1 >= 99.00% where decisive and centered cosine >= 0.9800, on 16 "
                      r"inputs\); inspect "
                      r"(\S+) or build with --ortPrepare=none", message)
    assert found, message
    folder = Path(found.group(5))
    try:
        assert sorted(p.name for p in folder.iterdir()) == ["faithful.onnx", "integer.onnx"]
        onnx.checker.check_model(onnx.load(folder / "integer.onnx"))
    finally:
        shutil.rmtree(folder)
    integer, faithful = (float(found.group(i)) for i in (1, 3))
    cosines = (float(found.group(i)) for i in (2, 4))
    assert min(integer, faithful) < 99.0 or min(cosines) < 0.98

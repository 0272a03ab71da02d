"""Engine hints: declared by a family, carried in the ONNX metadata, read by the ORT CPU
re-encoding (which runs only the passes they name)."""

from __future__ import annotations

import logging

import onnx
import pytest

from trtqat.engines.errors import EngineBuildError
from trtqat.engines.hints import HINTS_KEY, ORT_PASSES, EngineHints, read_hints
from trtqat.engines.ort_qdq import reencode_for_cpu

from .test_ort_qdq import _feeds, make_tiny_qdq


def _with_hints(model: onnx.ModelProto, value: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.metadata_props.append(onnx.StringStringEntryProto(key=HINTS_KEY, value=value))
    return out


@pytest.fixture(scope="module")
def tiny() -> onnx.ModelProto:
    return make_tiny_qdq()


def test_hints_round_trip_through_metadata(tiny):
    hints = EngineHints(("reencode_uint8", "prequantize_weights"), ("Softmax",))
    assert read_hints(_with_hints(tiny, hints.metadata()[HINTS_KEY])) == hints
    assert hints.ort_passes() == ("prequantize_weights", "reencode_uint8")  # run order
    assert read_hints(tiny) == EngineHints() and not EngineHints()
    assert EngineHints().ort_passes() == ORT_PASSES and EngineHints().metadata() == {}


def test_unknown_pass_is_refused_when_declared():
    with pytest.raises(EngineBuildError, match="unknown ORT rewrite.*fuse_everything.*use "
                       "fold_constants"):
        EngineHints(ort_rewrites=("fuse_everything",))


@pytest.mark.parametrize("value", ["{not json", '{"ort_rewrites": ["fuse_everything"]}', "[1]"])
def test_unreadable_hints_are_ignored_with_a_warning(tiny, caplog, value):
    with caplog.at_level(logging.WARNING, logger="trtqat.engines.hints"):
        assert read_hints(_with_hints(tiny, value)) == EngineHints()
    assert "ignoring the model's trtqat.engine_hints metadata" in caplog.text


def test_reencoding_runs_only_the_hinted_passes(tiny):
    feeds = _feeds()
    _, full = reencode_for_cpu(tiny, feeds, count_nodes=False)
    assert full["skipped_passes"] == [] and full["passes"]["output_quantizers_added"]
    hinted = _with_hints(tiny, EngineHints(("prequantize_weights", "reencode_uint8")).to_json())
    model, report = reencode_for_cpu(hinted, feeds, count_nodes=False, min_top1=0.0)
    assert set(report["passes"]) == {"weights_prequantized", "activations_reencoded"}
    assert "output_quantizers" in report["skipped_passes"]
    assert report["passes"]["weights_prequantized"] == full["passes"]["weights_prequantized"]
    # no output quantizers were added: fewer QuantizeLinear nodes than the full rewrite
    def count_q(m):
        return sum(n.op_type == "QuantizeLinear" for n in m.graph.node)
    assert count_q(model) < count_q(reencode_for_cpu(tiny, feeds, count_nodes=False)[0])

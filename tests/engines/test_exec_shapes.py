"""``trtqat-exec`` on an encoder-like ONNX: int64 inputs, batch and sequence both dynamic."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from trtqat.cli.exec_cmd import main
from trtqat.engines.feeds import valid_integer_feed
from trtqat.engines.onnx_io import index_input_bounds

from .test_ort_qdq_matmul import VOCAB, encoder_feeds, make_encoder

SHAPES = "input_ids:{0},attention_mask:{0},token_type_ids:{0}"
QUICK = ["--duration=0.1", "--warmUp=10", "--iterations=2", "--threads=1"]


@pytest.fixture(scope="module")
def encoder_onnx(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exec")
    _, qdq_model = make_encoder()
    path = folder / "enc-int8.onnx"
    onnx.save(qdq_model, str(path))
    feeds = encoder_feeds(((4, 12),))[0]
    np.savez(folder / "calib.npz", **feeds)
    return path, folder / "calib.npz"


def test_two_axis_shapes_build_and_benchmark_with_calibration(encoder_onnx, capsys):
    path, calib = encoder_onnx
    rc = main([f"--onnx={path}", "--shapes=" + SHAPES.format("3x10"),
               f"--calibInputs={calib}", *QUICK])
    out = capsys.readouterr().out
    assert rc == 0, out
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert f"Input {name}: int64 3x10" in out
    assert "Throughput:" in out and "Latency:" in out


def test_min_opt_max_profile_on_both_axes_and_saved_engine(encoder_onnx, tmp_path, capsys):
    path, _ = encoder_onnx
    engine = tmp_path / "enc.engine"
    rc = main([f"--onnx={path}", "--minShapes=" + SHAPES.format("1x4"),
               "--optShapes=" + SHAPES.format("2x16"), "--maxShapes=" + SHAPES.format("8x32"),
               f"--saveEngine={engine}", *QUICK])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Input input_ids: int64 2x16" in out  # opt shape is the run shape
    rc = main([f"--loadEngine={engine}", "--shapes=" + SHAPES.format("5x20"), *QUICK])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Input attention_mask: int64 5x20" in out


@pytest.mark.parametrize("shapes, message", [
    ("inputids:2x8,attention_mask:2x8,token_type_ids:2x8", "unknown input 'inputids'"),
    ("input_ids:16,attention_mask:2x8,token_type_ids:2x8", "rank 1"),
    ("input_ids:2xa,attention_mask:2x8,token_type_ids:2x8", "is not like 1x3x224x224"),
])
def test_bad_shapes_give_one_line_errors(encoder_onnx, capsys, shapes, message):
    path, _ = encoder_onnx
    rc = main([f"--onnx={path}", f"--shapes={shapes}", "--ortPrepare=none", *QUICK])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    errors = [line for line in err if line.startswith("trtqat-exec: error:")]
    assert len(errors) == 1 and message in errors[0], err


def test_random_integer_feeds_are_valid_token_inputs(encoder_onnx):
    path, _ = encoder_onnx
    bounds = index_input_bounds(onnx.load(str(path)))
    assert bounds == {"input_ids": VOCAB, "token_type_ids": 2}
    raw = {"input_ids": np.zeros((2, 6), np.int64), "attention_mask": np.zeros((2, 6), np.int64),
           "token_type_ids": np.ones((2, 6), np.int64), "pixels": np.full((2, 3), 0.5, np.float32)}
    feed = valid_integer_feed(raw, bounds)
    assert (feed["attention_mask"] == 1).all() and (feed["token_type_ids"] == 0).all()
    assert feed["input_ids"].dtype == np.int64 and 0 <= feed["input_ids"].min()
    assert feed["input_ids"].max() < VOCAB and len(np.unique(feed["input_ids"])) > 1
    assert feed["pixels"] is raw["pixels"]
    unknown = valid_integer_feed({"ids": np.zeros((1, 500), np.int32)}, {})
    assert unknown["ids"].max() < 1000 and unknown["ids"].dtype == np.int32

"""A Split whose outputs go partly to integer layers and partly to float ops (efficientvit's
linear attention: q, k, v out of one tensor, v padded in float) runs on uint8 in the ORT
engine (trtqat.engines.ort_qdq_moves): no dequantization of its whole input, no float
Split, and the outputs move no further from the Q/DQ model's."""

from __future__ import annotations

import numpy as np
import onnx

from trtqat.engines.ort_qdq import count_compute_nodes, optimized_model, reencode_for_cpu

from .qdq_nets import QDQNet, feeds, make
from .test_ort_activations import _unoptimised


def split_pad(net: QDQNet, x: str) -> str:
    a = net.node("Relu", [net.conv(x, 3, 8)])
    x1, x2 = net.node("Split", [a, net.const(np.array([4, 4], np.int64))], outputs=2, axis=1)
    pad = net.node("Pad", [x2, net.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                           net.const(np.float32(1.0))], mode="constant")
    b = net.node("Relu", [net.conv(x1, 4, 4, k=1)])
    c = net.node("Relu", [net.conv(pad, 4, 4, k=3)])
    return net.head(net.node("Mul", [b, net.node("Slice", [c, net.const(np.array([1, 1])),
                                                           net.const(np.array([17, 17])),
                                                           net.const(np.array([2, 3]))])]), 4)


def _split_reads_integers(model: onnx.ModelProto) -> bool:
    producer = {o: n for n in model.graph.node for o in n.output}
    split = next(n for n in model.graph.node if n.op_type == "Split")
    return getattr(producer.get(split.input[0]), "op_type", "") != "DequantizeLinear"


def test_split_with_a_float_reader_stays_on_uint8():
    _, qdq_model = make(split_pad)
    check = feeds(n=1, batch=32, seed=5)
    new, report = reencode_for_cpu(qdq_model, None, threads=1, check_feeds=check)
    assert report["passes"]["move_outputs_quantized"] == 1
    assert _split_reads_integers(optimized_model(new, 1))
    skip = ("fold_constants", "prequantize_weights", "fold_batchnorm", "reducemean_to_gap",
            "unify_quantizers", "float_narrow_convs", "integer_activations",
            "output_quantizers", "absorb_clips", "reencode_uint8", "quantize_gemm_bias",
            "fuse_matmul_epilogues", "float_output_convs")
    from trtqat.engines.hints import HINTS_KEY, EngineHints

    hinted = onnx.load_from_string(qdq_model.SerializeToString())
    hinted.metadata_props.add(key=HINTS_KEY, value=EngineHints(skip).to_json())
    without, _ = reencode_for_cpu(hinted, None, threads=1, count_nodes=False)
    assert not _split_reads_integers(optimized_model(without, 1))  # the float Split before
    # exact: the same outputs as without the pass
    from trtqat.engines.ort_qdq import cpu_session

    feed = check[0]
    got = cpu_session(new, 1).run(None, feed)[0]
    np.testing.assert_allclose(got, cpu_session(without, 1).run(None, feed)[0], atol=1e-6)
    assert np.abs(got - _unoptimised(qdq_model, feed)).max() <= 0.1 * np.abs(got).max()
    assert count_compute_nodes(optimized_model(new, 1))["integer"]["QLinearConv"] == 3

"""The encoder's export interface: inputs, dynamic axes, and Q/DQ on every MatMul input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_bert import calibrated_encoder

from trtqat.families.encoder.export import (
    OUTPUT_NAMES,
    encoder_dynamic_axes,
    encoder_input_names,
    encoder_shapes,
    example_inputs_for_encoder,
)
from trtqat.quant import export_mode


def test_example_inputs(tiny):
    _, tok = tiny
    ex = example_inputs_for_encoder(tok, batch_size=3, max_length=12)
    assert list(ex) == list(encoder_input_names(tok))
    assert all(v.shape == (3, 12) and v.dtype == torch.int64 for v in ex.values())
    assert ex["attention_mask"][-1].sum() < 12  # the last row is padded
    assert encoder_shapes(1, 128) == ("input_ids:1x128,attention_mask:1x128,"
                                      "token_type_ids:1x128")
    axes = encoder_dynamic_axes()
    assert axes["input_ids"] == {0: "batch", 1: "sequence"} and axes["sentence_embedding"] == {
        0: "batch"}


# The legacy (TorchScript) exporter is deprecated and warns about traced Python conditions;
# the two checked shapes below show the trace generalises over both dynamic axes.
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                            "ignore::torch.jit.TracerWarning")
def test_int8_onnx_has_qdq_on_every_matmul_input_and_matches_ort(tiny, sentences, tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    model, tok = tiny
    q = calibrated_encoder(model, tok, sentences, max_length=32)
    ex = example_inputs_for_encoder(tok, 2, 16, sentences)
    path = tmp_path / "tiny-int8.onnx"
    with export_mode.enabled(), torch.no_grad():
        torch.onnx.export(q, tuple(ex.values()), str(path), input_names=list(ex),
                          output_names=list(OUTPUT_NAMES), dynamic_axes=encoder_dynamic_axes(ex),
                          opset_version=17, dynamo=False)
    graph = onnx.load(str(path)).graph
    producer = {o: n for n in graph.node for o in n.output}

    def from_dq(name: str) -> bool:  # through a Transpose (Linear weights, K^T)
        node = producer.get(name)
        while node is not None and node.op_type == "Transpose":
            node = producer.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    matmuls = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    assert len(matmuls) == 2 * (6 + 2)  # per layer: 6 Linear + Q.K^T + P.V
    assert all(from_dq(n.input[0]) and from_dq(n.input[1]) for n in matmuls)
    assert not any(n.op_type == "DequantizeLinear" and producer[n.input[0]].op_type not in (
        "QuantizeLinear",) and n.input[0] not in {i.name for i in graph.initializer}
        for n in graph.node)
    # run as trtqat's ORT engine does (plain ORT's u8s8 kernels saturate on x86 CPUs without
    # VNNI, see trtqat.engines.ort_u8s8); no CPU re-encoding: the file as exported
    from trtqat.engines import build_engine

    engine = build_engine(path, "ort", threads=1, ort_prepare="none")
    with engine.runner(threads=1) as runner:
        for b, n in ((2, 16), (3, 9)):  # both axes dynamic
            feed = example_inputs_for_encoder(tok, b, n, sentences)
            with torch.no_grad():
                want = q(**feed).numpy()
            got = runner.infer({k: v.numpy() for k, v in feed.items()})[OUTPUT_NAMES[0]]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-4)

"""``export_encoder``: checked ONNX files of a sentence encoder, batch and sequence dynamic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tiny_bert import calibrated_encoder  # noqa: E402

from trtqat.export import ExportError, ValidationError, lint_model  # noqa: E402
from trtqat.export.validate import ort_session  # noqa: E402
from trtqat.families.encoder import export_encoder, quantize_transformer  # noqa: E402
from trtqat.families.encoder import onnx_export as enc_export  # noqa: E402
from trtqat.families.encoder.export import example_inputs_for_encoder  # noqa: E402
from trtqat.families.encoder.onnx_export import EncoderExporter, fidelity_check  # noqa: E402


@pytest.fixture
def calibrated(tiny, sentences):
    model, tok = tiny
    return calibrated_encoder(model, tok, sentences, max_length=32), tok


def _dims(value) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_variants_are_dynamic_validated_and_lint_clean(calibrated, sentences, tmp_path,
                                                        monkeypatch):
    q, tok = calibrated
    exporter = EncoderExporter(q, tok, sentences=sentences)
    r32 = exporter.export(tmp_path / "enc-fp32.onnx", "fp32")
    r8 = exporter.export(tmp_path / "enc-int8.onnx", "int8", metadata={"trtqat.arch": "tiny"})
    r16 = exporter.export(tmp_path / "enc-fp16.onnx", "fp16")  # reuses the float graph
    assert r32.passed and r16.passed and r16.lint is None
    assert r8.passed and r8.lint is not None and r8.lint.findings == []
    monkeypatch.setitem(enc_export.MIN_COSINE, "fp16", 1.5)  # unreachable: check fails
    with pytest.raises(ValidationError, match="no file kept") as info:
        exporter.export(tmp_path / "enc-fp16-bad.onnx", "fp16")
    assert not info.value.result.passed
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "enc-fp16.onnx", "enc-fp32.onnx", "enc-int8.onnx"]  # no temporary file either
    m16 = onnx.load(tmp_path / "enc-fp16.onnx")
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in m16.graph.initializer)
    line = next(c for c in r8.checks if c.name.startswith("output"))
    assert "fake-quant" in line.name and "2x16, 3x9" in line.detail and "cosine" in line.detail

    m8 = onnx.load(tmp_path / "enc-int8.onnx")
    assert [i.name for i in m8.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(_dims(i) == ["batch", "sequence"] for i in m8.graph.input)
    assert [o.name for o in m8.graph.output] == ["sentence_embedding"]
    assert _dims(m8.graph.output[0]) == ["batch", 32]
    meta = {p.key: p.value for p in m8.metadata_props}
    assert meta["trtqat.variant"] == "int8" and meta["trtqat.task"] == "sentence-embedding"
    assert meta["trtqat.arch"] == "tiny"
    int8_weights = [t for t in m8.graph.initializer if t.data_type == onnx.TensorProto.INT8
                    and len(t.dims) == 2]
    assert len(int8_weights) == 2 * 6  # 6 Linear per layer, 1 byte per weight
    ops = [n.op_type for n in m8.graph.node]
    assert ops.count("MatMul") == 2 * 8  # 6 Linear + Q.K^T + P.V per layer
    m32 = onnx.load(tmp_path / "enc-fp32.onnx")
    assert not any(n.op_type.endswith("Linear") for n in m32.graph.node)

    # a third shape, neither traced nor validated: the file generalises over both axes
    feed = example_inputs_for_encoder(tok, 1, 23, sentences)
    got = ort_session(tmp_path / "enc-int8.onnx").run(
        None, {k: v.numpy() for k, v in feed.items()})[0]
    with torch.no_grad():
        want = q(**feed).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)

    # hand-broken attention: feed Q.K^T's K operand without its Q/DQ -> lint error
    qk = next(n for n in m8.graph.node if n.name.endswith("matmul_qk/MatMul"))
    dq = next(n for n in m8.graph.node if n.output[0] == qk.input[1])
    quant = next(n for n in m8.graph.node if n.output[0] == dq.input[0])
    qk.input[1] = quant.input[0]
    report = lint_model(m8)
    assert any(f.rule == "unquantized-input" and f.node == qk.name for f in report.errors)


def test_uncalibrated_or_unquantized_encoder_is_refused(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(ExportError, match="no active quantizer"):
        export_encoder(model, tok, tmp_path / "a.onnx", "int8")
    quantize_transformer(model)  # quantizers, but no calibration
    with pytest.raises(ExportError, match="not calibrated"):
        export_encoder(model, tok, tmp_path / "b.onnx", "int8")
    assert list(tmp_path.iterdir()) == []


def test_sequence_longer_than_the_positions_is_refused(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(ExportError, match="64 positions"):
        export_encoder(model, tok, tmp_path / "x.onnx", "fp32", shapes=((2, 80),))


def test_fidelity_check_uses_the_worst_sentence():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(3, 8)).astype(np.float32)
    assert fidelity_check("int8", "e", [(ref + 1e-5, ref)], [(3, 4)]).passed
    bad = ref.copy()
    bad[2] = -bad[2]  # one sentence broken: the mean cosine is still 1/3, min is -1
    check = fidelity_check("int8", "e", [(bad, ref)], [(3, 4)])
    assert not check.passed and "min -1.0" in check.detail
    assert not fidelity_check("fp32", "e", [(ref[:2], ref)], [(3, 4)]).passed  # shape

"""int4 and int4-fp16 export: INT4 initializers -> DequantizeLinear(axis, block_size) at
opset 21, dequantizing exactly the PyTorch model's weights, checked in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from torch import nn

import trtqat
from trtqat.export.errors import ExportError
from trtqat.export.onnx_export import Exporter
from trtqat.variants import expand_variants


class Mixed(nn.Module):
    """A Linear on 2-D rows (a Gemm) and attention on 3-D tokens (MatMuls)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.fc(x)).reshape(x.shape[0], 2, 32)
        a, _ = self.mha(h, h, h, need_weights=False)
        return self.head(a + h).mean(1)


@pytest.fixture(scope="module")
def int4_model():
    torch.manual_seed(0)
    x = torch.randn(16, 64)
    model = trtqat.quantize(Mixed().eval(), {"format": "int4", "block_size": 32},
                            forward_loop=[x])
    return model, x


def _dequantized(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        codes = inits[node.input[0]]
        assert codes.data_type == TensorProto.INT4
        attrs = {a.name: a.i for a in node.attribute}
        scales = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        full = np.repeat(scales, attrs["block_size"], axis=attrs["axis"])
        out[node.output[0]] = numpy_helper.to_array(codes).astype(np.float32) * full
    return out


def test_int4_variants_store_the_pytorch_codes_and_match_ort(int4_model, tmp_path):
    model, x = int4_model
    exporter = Exporter(model, x[:2])
    results = {v: exporter.export(tmp_path / f"m-{v}.onnx", v) for v in ("int4", "int4-fp16")}
    for result in results.values():
        assert result.opset == 21 and all(c.passed for c in result.checks), result.checks
        assert result.checks[-1].name == "output 'output' vs PyTorch"
    proto = onnx.load(tmp_path / "m-int4.onnx")
    weights = _dequantized(proto)
    assert len(weights) == 4  # fc, mha in_proj, mha out_proj, head
    scales = {n.input[1] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    assert not [t.name for t in proto.graph.initializer if t.data_type == TensorProto.FLOAT
                and len(t.dims) == 2 and t.name not in scales]  # no float weight left
    with torch.no_grad():
        fc = model.fc._weight_quantizer(model.fc.weight).numpy()
    # bit for bit the PyTorch fake-quantized weight (as stored, or transposed for a MatMul)
    assert any(np.array_equal(w, fc) or np.array_equal(w, fc.T) for w in weights.values())
    from trtqat.export.validate import ort_session

    # the graph as written (ORT's own optimizations fuse DQ -> MatMul into MatMulNBits,
    # which rounds differently: 3e-3 here)
    session = ort_session(tmp_path / "m-int4.onnx")
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)  # float32 rounding only
    assert expand_variants("all", "int4") == ("fp32", "fp16", "int4", "int4-fp16")


@pytest.mark.parametrize("case, match", [
    ("opset", r"--opset 19 is too low for int4: .* use --opset 21"),
    ("int8-of-int4", r"quantized in INT4, so it has no int8 variant: export int4, int4-fp16"),
    ("int4-of-int8", r"quantized in INT8, so it has no int4 variant: export int8, int8-fp16"),
])
def test_bad_int4_export_requests_are_one_line(int4_model, tmp_path, case, match):
    model, x = int4_model
    variant, opset = {"opset": ("int4", 19), "int8-of-int4": ("int8", 17),
                      "int4-of-int8": ("int4", 21)}[case]
    if case == "int4-of-int8":
        model = trtqat.quantize(Mixed().eval(), forward_loop=[x])
    with pytest.raises(ExportError, match=match) as info:
        Exporter(model, x[:2]).export(tmp_path / "m.onnx", variant, opset)
    assert "\n" not in str(info.value) and not list(tmp_path.iterdir())


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 64)
        self.fc = nn.Linear(64, 8)

    def forward(self, ids):
        return self.fc(self.emb(ids)).mean(1)


def test_int4_embedding_tables_are_opt_in_and_export_as_int4(tmp_path):
    from trtqat.quant.blockwise import Int4Embedding, to_int4_weights
    from trtqat.quant.config import QuantConfig
    from trtqat.quant.model_ops import calibrating
    from trtqat.quant.placement import place

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (4, 6))
    model = trtqat.quantize(Tokens().eval(), {"format": "int4", "block_size": 32})
    assert type(model.emb) is nn.Embedding  # default: Linear weights only
    model = Tokens().eval()
    place(model, QuantConfig())
    assert to_int4_weights(model, 32, embeddings=True) == 2
    assert isinstance(model.emb, Int4Embedding)
    with calibrating(model), torch.no_grad():
        model(ids)
    trtqat.compute_amax(model, "max")
    result = Exporter(model, ids[:2]).export(tmp_path / "t.onnx", "int4")
    assert all(c.passed for c in result.checks), result.checks
    proto = onnx.load(tmp_path / "t.onnx")
    gather = next(n for n in proto.graph.node if n.op_type == "Gather")
    assert gather.input[0] in _dequantized(proto)  # the table: INT4 codes -> DQ -> Gather
    with torch.no_grad():
        table = model.emb._weight_quantizer(model.emb.weight).numpy()
    np.testing.assert_array_equal(_dequantized(proto)[gather.input[0]], table)


def test_awq_scaled_int4_model_exports_its_scaling_in_every_variant(tmp_path):
    from trtqat.quant.awq import apply_awq
    from trtqat.quant.blockwise import to_int4_weights
    from trtqat.quant.config import QuantConfig
    from trtqat.quant.placement import place

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = torch.randn(64, 64)
    x[:, :4] *= 20
    with torch.no_grad():
        want = model(x).numpy()
    place(model, QuantConfig())
    to_int4_weights(model, 32)
    apply_awq(model, lambda m, b: m(b), [x])
    trtqat.calibrate(model, [x], "max")
    exporter = Exporter(model, x[:2])
    for variant in ("fp32", "int4"):
        result = exporter.export(tmp_path / f"{variant}.onnx", variant)
        assert all(c.passed for c in result.checks), result.checks
    from trtqat.export.validate import ort_session

    session = ort_session(tmp_path / "fp32.onnx")  # the float model, the scaling inside it
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    ops = [n.op_type for n in onnx.load(tmp_path / "int4.onnx").graph.node]
    assert "Mul" in ops and ops.count("DequantizeLinear") == 2

"""CPU re-encoding of MatMul (transformer) Q/DQ graphs (trtqat.engines.ort_qdq_matmul).

The model is a one-layer, one-head BERT-like encoder built directly in ONNX, laid out like
the exporter's TensorRT-style Q/DQ: int64 ``input_ids``/``attention_mask``/
``token_type_ids`` (batch and sequence dynamic), Linear weights as ``Q(float W) -> DQ (per
output channel) -> Transpose -> MatMul`` with scales computed by Reshape nodes, Q/DQ on
every activation MatMul input, Kᵀ through a Transpose before its Q, a scaled and masked
Softmax, mean pooling into ``sentence_embedding``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.engines.ort_qdq import (
    AgreementError,
    check_agreement,
    count_compute_nodes,
    cpu_session,
    is_embedding_output,
    optimized_model,
    prepare_model,
    reencode_for_cpu,
)
from trtqat.engines.ort_qdq_matmul import has_quantized_matmul

HIDDEN, VOCAB, FFN = 32, 60, 64
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _Encoder:
    """Builds the encoder; ``amax=None`` builds it in float and records the activations
    that get a quantizer (their ranges calibrate the quantized build)."""

    def __init__(self, amax: dict[str, float] | None) -> None:
        self.rng = np.random.default_rng(3)
        self.amax, self.recorded = amax, []
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def computed_scale(self, name: str, value: np.ndarray) -> str:
        """A scale computed by a Reshape of a Constant node, as the legacy exporter writes it."""
        c = helper.make_tensor(f"{name}_c", TensorProto.FLOAT, [value.size], value.reshape(-1))
        self.nodes.append(helper.make_node("Constant", [], [f"{name}_c"], value=c))
        shape = self.const(f"{name}_shape", np.array(value.shape, np.int64))
        return self.node("Reshape", [f"{name}_c", shape], name)

    def qdq(self, x: str, user: str) -> str:
        """One quantizer per reader (as the exporter writes them; the rewrite unifies)."""
        if self.amax is None:
            self.recorded.append(x)
            return x
        s = self.computed_scale(f"{user}_in_s", np.array(self.amax[x] / 127.0, np.float32))
        z = self.const(f"{user}_in_z", np.array(0, np.int8))
        q = self.node("QuantizeLinear", [x, s, z], f"{user}_in_q")
        return self.node("DequantizeLinear", [q, s, z], f"{user}_in_dq")

    def linear(self, x: str, name: str, n_in: int, n_out: int) -> str:
        w = (self.rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = self.const(f"{name}_b", (0.1 * self.rng.standard_normal(n_out)).astype(np.float32))
        if self.amax is None:
            wt = self.const(f"{name}_wt", np.ascontiguousarray(w.T))
        else:
            wname = self.const(f"{name}_w", w)
            s = self.computed_scale(f"{name}_ws", (np.abs(w).max(1) / 127.0).astype(np.float32))
            z = self.const(f"{name}_wz", np.zeros(n_out, np.int8))
            wq = self.node("QuantizeLinear", [wname, s, z], f"{name}_wq", axis=0)
            wdq = self.node("DequantizeLinear", [wq, s, z], f"{name}_wdq", axis=0)
            wt = self.node("Transpose", [wdq], f"{name}_wt", perm=[1, 0])
        y = self.node("MatMul", [self.qdq(x, name), wt], f"{name}_mm")
        return self.node("Add", [y, b], f"{name}_out")

    def layernorm(self, x: str, name: str) -> str:
        g = self.const(f"{name}_g", np.ones(HIDDEN, np.float32))
        b = self.const(f"{name}_b", np.zeros(HIDDEN, np.float32))
        return self.node("LayerNormalization", [x, g, b], name, axis=-1)

    def build(self) -> onnx.ModelProto:
        n = self.node
        words = self.const("word_emb", self.rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32))
        types = self.const("type_emb", self.rng.standard_normal((2, HIDDEN)).astype(np.float32))
        emb = n("Add", [n("Gather", [words, "input_ids"], "we"),
                        n("Gather", [types, "token_type_ids"], "te")], "emb")
        x = self.layernorm(emb, "ln0")
        q, k, v = (self.linear(x, name, HIDDEN, HIDDEN) for name in ("q", "k", "v"))
        kt = n("Transpose", [k], "kt", perm=[0, 2, 1])
        scores = n("MatMul", [self.qdq(q, "qk_a"), self.qdq(kt, "qk_b")], "qk")
        scaled = n("Mul", [scores, self.const("inv_sqrt", np.array(HIDDEN ** -0.5, np.float32))],
                   "qk_scaled")
        maskf = n("Cast", ["attention_mask"], "maskf", to=TensorProto.FLOAT)
        neg = n("Mul", [n("Sub", [self.const("one", np.array(1.0, np.float32)), maskf], "inv"),
                        self.const("big", np.array(-10000.0, np.float32))], "neg")
        bias = n("Unsqueeze", [neg, self.const("ax1", np.array([1], np.int64))], "mask_bias")
        probs = n("Softmax", [n("Add", [scaled, bias], "masked")], "probs", axis=-1)
        ctx = n("MatMul", [self.qdq(probs, "pv_a"), self.qdq(v, "pv_b")], "ctx")
        h = self.layernorm(n("Add", [self.linear(ctx, "o", HIDDEN, HIDDEN), x], "res1"), "ln1")
        up = self.linear(h, "up", HIDDEN, FFN)
        act = n("Mul", [up, n("Sigmoid", [n("Mul", [up, self.const(
            "k1702", np.array(1.702, np.float32))], "up_k")], "up_sig")], "gelu")
        h2 = self.layernorm(n("Add", [self.linear(act, "down", FFN, HIDDEN), h], "res2"), "ln2")
        m3 = n("Unsqueeze", [maskf, self.const("ax2", np.array([2], np.int64))], "mask3")
        axis1 = self.const("axis1", np.array([1], np.int64))
        summed = n("ReduceSum", [n("Mul", [h2, m3], "masked_h"), axis1], "summed", keepdims=0)
        count = n("ReduceSum", [m3, axis1], "count", keepdims=0)
        pooled = n("Div", [summed, count], "pooled")
        norm = n("ReduceL2", [pooled], "norm", axes=[1], keepdims=1)
        n("Div", [pooled, norm], "sentence_embedding")
        ints = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
                for name in INPUTS]
        out = helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT,
                                            ["batch", HIDDEN])
        graph = helper.make_graph(self.nodes, "tiny_encoder", ints, [out], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=10)


def encoder_feeds(batches=((2, 12), (3, 7)), seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Int64 feeds with padded rows (both axes vary between feeds)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for b, s in batches:
        mask = np.ones((b, s), np.int64)
        mask[-1, s // 2:] = 0
        feeds.append({"input_ids": rng.integers(0, VOCAB, (b, s)).astype(np.int64) * mask,
                      "attention_mask": mask, "token_type_ids": np.zeros((b, s), np.int64)})
    return feeds


def make_encoder(feeds: list[dict[str, np.ndarray]] | None = None) -> tuple[onnx.ModelProto,
                                                                          onnx.ModelProto]:
    """(float model, TensorRT-style Q/DQ model calibrated with max on ``feeds``)."""
    fp = _Encoder(None)
    float_model = fp.build()
    probe = onnx.ModelProto()
    probe.CopyFrom(float_model)
    for name in fp.recorded:
        probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = cpu_session(probe, threads=1)
    amax = dict.fromkeys(fp.recorded, 1e-6)
    for feed in feeds or encoder_feeds():
        for name, value in zip(fp.recorded, session.run(fp.recorded, feed)):
            amax[name] = max(amax[name], float(np.abs(value).max()))
    return float_model, _Encoder(amax).build()


@pytest.fixture(scope="module")
def models():
    return make_encoder()


def _matmuls(model: onnx.ModelProto) -> tuple[int, int]:
    counts = count_compute_nodes(optimized_model(model, threads=1))
    integer = sum(v for k, v in counts["integer"].items() if "MatMul" in k)
    floating = sum(v for k, v in counts["float"].items() if "MatMul" in k)
    return integer, floating


def test_reencoded_encoder_runs_every_matmul_in_integer_and_agrees(models):
    float_model, qdq_model = models
    assert has_quantized_matmul(qdq_model) and not has_quantized_matmul(float_model)
    feeds = encoder_feeds()
    new, report = reencode_for_cpu(qdq_model, feeds, threads=1)
    epilogues = report["passes"]["matmul_epilogues"]
    assert epilogues["bias_fused"] == 6 and epilogues["scale_folded"] == 1
    assert report["passes"]["activations_reencoded"]["uint8_zero_point_0"] >= 1  # Softmax
    integer, floating = _matmuls(new)
    assert integer == 8 and floating == 0  # 6 Linear + Q·Kᵀ + P·V
    before, after = report["compute_nodes"]["before"], report["compute_nodes"]["after"]
    assert after["float_total"] < before["float_total"]  # bias Add and scale Mul absorbed
    assert report["agreement"]["metric"] == "cosine"
    assert report["agreement"]["mean_cosine"] >= 0.99
    # both axes stay dynamic; the quantized engine is close to the float model too
    ref, new_sess = cpu_session(float_model, 1), cpu_session(new, 1)
    for feed in encoder_feeds(((1, 5), (4, 16)), seed=1):
        want, got = ref.run(None, feed)[0], new_sess.run(None, feed)[0]
        assert got.shape == want.shape == (feed["input_ids"].shape[0], HIDDEN)
        assert float((want * got).sum(-1).min()) > 0.95


def test_embedding_agreement_uses_cosine_and_rejects_a_broken_model(models):
    float_model, qdq_model = models
    assert is_embedding_output(float_model)  # output name
    broken = onnx.ModelProto()
    broken.CopyFrom(float_model)
    for init in broken.graph.initializer:
        if init.name == "word_emb":
            arr = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(np.roll(arr, 1, axis=1), init.name))
    with pytest.raises(AgreementError, match="mean cosine similarity"):
        check_agreement(float_model, broken, encoder_feeds(), threads=1)
    # min_cosine overrides min_top1 for embeddings; top-1 stays available
    result = check_agreement(float_model, qdq_model, encoder_feeds(), threads=1,
                             min_cosine=0.5, min_top1=1.0)
    assert result["metric"] == "cosine" and result["mean_cosine"] > 0.9
    assert check_agreement(float_model, float_model, encoder_feeds(), threads=1,
                           metric="top1")["top1_agreement"] == 1.0


def test_embedding_detection_by_metadata_and_unit_rows():
    model = onnx.ModelProto()
    entry = model.metadata_props.add()
    entry.key, entry.value = "trtqat.task", "sentence-embedding"
    assert is_embedding_output(model)
    plain = onnx.ModelProto()
    rows = np.random.default_rng(0).standard_normal((4, 8))
    assert not is_embedding_output(plain, [rows])
    assert is_embedding_output(plain, [rows / np.linalg.norm(rows, axis=1, keepdims=True)])


def test_prepare_model_takes_int64_feed_dicts(models):
    _, qdq_model = models
    options = SimpleNamespace(calib_feeds=tuple(encoder_feeds()), min_top1=0.99, threads=1)
    prepared = prepare_model(qdq_model, options)
    meta = {p.key: p.value for p in prepared.metadata_props}
    assert '"metric": "cosine"' in meta["trtqat.cpu_reencode"]
    assert any(n.op_type == "MatMulIntegerToFloat" for n in prepared.graph.node)

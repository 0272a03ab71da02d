"""CPU re-encoding of TensorRT-style Q/DQ graphs (trtqat.engines.ort_qdq).

The models are built directly in ONNX, shaped like ``trtqat.export`` output for a BN-folded
residual CNN: int8 symmetric per-tensor Q/DQ on conv/pool/gemm inputs and on the residual
identity, per-channel int8 weights, ``ReduceMean`` + ``Reshape`` + ``Gemm`` head.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.engines.errors import EngineBuildError
from trtqat.engines.ort_qdq import (
    AgreementError,
    check_agreement,
    count_compute_nodes,
    optimized_model,
    prepare_model,
    reencode_for_cpu,
)
from trtqat.errors import TrtqatError

CLASSES, SIZE = 4, 16


class _Net:
    """Builds the tiny network; ``scales=None`` builds the float net and records the tensors
    whose range the activation quantizers need."""

    def __init__(self, scales: list[float] | None, residual_factor: float = 1.0) -> None:
        self.rng = np.random.default_rng(7)
        self.scales, self.residual_factor = scales, residual_factor
        self.quantizers = 0
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.points: list[str] = []
        self.n = 0

    def _name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def init(self, hint: str, value: np.ndarray) -> str:
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def qdq(self, x: str, factor: float = 1.0) -> str:
        """An activation quantizer (int8, zero-point 0, amax from calibration) on ``x``."""
        if self.scales is None:
            self.points.append(x)
            return x
        amax = self.scales[self.quantizers]
        self.quantizers += 1
        scale = self.init("scale", np.float32(amax * factor / 127.0))
        zero = self.init("zp", np.int8(0))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, scale, zero]), scale, zero])

    def weight(self, w: np.ndarray) -> str:
        """Per-output-channel int8 Q/DQ on a float weight initializer (as exported)."""
        name = self.init("w", w.astype(np.float32))
        if self.scales is None:
            return name
        amax = np.abs(w.reshape(w.shape[0], -1)).max(1)
        scale = self.init("wscale", (amax / 127.0).astype(np.float32))
        zero = self.init("wzp", np.zeros(w.shape[0], np.int8))
        q = self.node("QuantizeLinear", [name, scale, zero], axis=0)
        return self.node("DequantizeLinear", [q, scale, zero], axis=0)

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        b = self.init("b", (0.1 * self.rng.standard_normal(cout)).astype(np.float32))
        return self.node("Conv", [self.qdq(x), self.weight(w), b], kernel_shape=[k, k],
                         strides=[stride, stride], pads=[k // 2] * 4)

    def block(self, x: str, cin: int, cout: int, stride: int) -> str:
        a = self.node("Relu", [self.conv(x, cin, cout, 3, stride)])
        b = self.conv(a, cout, cout)
        if stride == 1 and cin == cout:
            identity = self.qdq(x, self.residual_factor)
        else:
            identity = self.qdq(self.conv(x, cin, cout, 1, stride))
        return self.node("Relu", [self.node("Add", [b, identity])])

    def build(self, fc: tuple[np.ndarray, np.ndarray] | None = None) -> onnx.ModelProto:
        x = self.node("Relu", [self.conv("input", 3, 8)])
        x = self.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        x = self.block(self.block(x, 8, 8, 1), 8, 16, 2)
        axes = self.init("axes", np.array([-1, -2], np.int64))
        pooled = self.node("ReduceMean", [self.qdq(x), axes], keepdims=1)
        shape = self.init("shape", np.array([-1, 16], np.int64))
        feat = self.node("Reshape", [pooled, shape])
        self.feature = feat
        w, b = fc if fc is not None else (self.rng.standard_normal((CLASSES, 16)), np.zeros(CLASSES))
        logits = self.node("Gemm", [self.qdq(feat), self.weight(w),
                                    self.init("fcb", b.astype(np.float32))], transB=1)
        graph = helper.make_graph(
            self.nodes, "tiny_resnet",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
            [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["batch", CLASSES])],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                                  ir_version=10)
        onnx.checker.check_model(model)
        return model


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray], names: list[str] | None = None):
    import onnxruntime as ort

    probe = copy.deepcopy(model)
    for name in names or []:
        probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(names, feed)


def _feeds(n: int = 4, batch: int = 16, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Images of CLASSES random templates plus noise (labels cycle through the classes)."""
    templates = np.random.default_rng(123).standard_normal((CLASSES, 3, SIZE, SIZE))
    rng = np.random.default_rng(seed)
    labels = np.arange(batch) % CLASSES
    return [{"input": (templates[labels] + 0.5 * rng.standard_normal((batch, 3, SIZE, SIZE)))
             .astype(np.float32)} for _ in range(n)]


def make_tiny_qdq(residual_factor: float = 1.0) -> onnx.ModelProto:
    """The TensorRT-style Q/DQ tiny ResNet: max-calibrated on :func:`_feeds`, with a
    nearest-centroid classifier (clear top-1 margins, like a trained model).
    ``residual_factor`` != 1 gives the identity quantizer of block 1 its own scale."""
    calib = _feeds()
    net = _Net(None)
    model = net.build()
    values = [_run(model, f, net.points + [net.feature]) for f in calib]
    amax = [max(float(np.abs(v[i]).max()) for v in values) for i in range(len(net.points))]
    feats = np.concatenate([v[-1] for v in values])
    labels = np.concatenate([np.arange(len(f["input"])) % CLASSES for f in calib])
    centroids = np.stack([feats[labels == c].mean(0) for c in range(CLASSES)])
    w = centroids - centroids.mean(0)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    # same seed, same construction order: the quantized net has the float net's weights
    return _Net(amax, residual_factor).build(fc=(w, np.zeros(CLASSES)))


@pytest.fixture(scope="module")
def tiny() -> onnx.ModelProto:
    return make_tiny_qdq()


@pytest.fixture(scope="module")
def reencoded(tiny):
    return reencode_for_cpu(tiny, _feeds())


def test_optimised_graph_runs_integer_kernels(tiny, reencoded):
    model, report = reencoded
    before = count_compute_nodes(optimized_model(tiny))
    after = count_compute_nodes(optimized_model(model))
    n_conv = sum(n.op_type == "Conv" for n in tiny.graph.node)
    # as exported only the downsample conv (int8 in, int8 out) can fuse; the rest is float
    assert before["float"].get("Conv", 0) + before["float"].get("FusedConv", 0) >= 5
    assert before["integer"].get("QLinearConv", 0) <= 1 and "QLinearAdd" not in before["integer"]
    assert after["integer"]["QLinearConv"] == n_conv == 6
    assert after["integer"]["QLinearAdd"] == 2
    assert after["integer"]["QLinearGlobalAveragePool"] == 1
    assert after["integer"]["QGemm"] == 1
    assert not {"Conv", "FusedConv", "Add", "Gemm", "ReduceMean"} & set(after["float"])
    assert after["float_total"] == 0
    assert report["compute_nodes"]["after"] == after
    assert report["compute_nodes"]["before"] == before


def test_report_says_what_was_rewritten(reencoded):
    _, report = reencoded
    passes = report["passes"]
    assert report["rewritten"] is True
    assert passes["weights_prequantized"] == 7
    assert passes["reducemean_to_globalaveragepool"] == 1
    assert passes["gemm_bias_quantized"] == 1
    added = passes["output_quantizers_added"]
    assert added["calibrated"] == 2  # the conv outputs that feed an Add
    assert added["from_joined_quantizer"] == 2  # before MaxPool and after GlobalAveragePool
    assert passes["activations_reencoded"]["uint8_zero_point_0"] >= 5  # post-ReLU tensors


def test_outputs_agree_with_unmodified_model(tiny, reencoded):
    model, report = reencoded
    feeds = _feeds(n=2, seed=5)  # not the calibration inputs
    result = check_agreement(tiny, model, feeds)
    assert result["samples"] == 32
    assert result["top1_agreement"] >= 0.99
    assert result["max_abs_diff"] <= 0.1 * result["max_abs_reference"]
    assert report["agreement"]["top1_agreement"] >= 0.99


def test_input_model_is_not_modified(tiny):
    before = tiny.SerializeToString()
    reencode_for_cpu(tiny, None, count_nodes=False)
    assert tiny.SerializeToString() == before


def _single_qdq(relu: bool, scale: float = 0.05) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"])] if relu else []
    src = "r" if relu else "x"
    nodes += [helper.make_node("QuantizeLinear", [src, "s", "z"], ["q"]),
              helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        [numpy_helper.from_array(np.float32(scale), "s"), numpy_helper.from_array(np.int8(0), "z")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _zero_points(model: onnx.ModelProto) -> set[tuple[int, str]]:
    """(value, dtype) of the zero-points of every Q and DQ node."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {(int(inits[n.input[2]]), inits[n.input[2]].dtype.name) for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear")}


def test_uint8_zero_point_128_is_exact():
    model = _single_qdq(relu=False)
    # every int8 level, the rounding midpoints between them, and saturation on both sides
    x = np.concatenate([np.arange(-140, 141) * 0.05, np.arange(-140, 140) * 0.05 + 0.025,
                        np.random.default_rng(0).uniform(-8, 8, 3000)]).astype(np.float32)
    feed = {"x": np.resize(x, (len(x) // 10 * 10,)).reshape(-1, 10)}
    new, report = reencode_for_cpu(model, [feed], count_nodes=False)
    assert _zero_points(new) == {(128, "uint8")}
    assert report["passes"]["activations_reencoded"] == {"uint8_zero_point_128": 1}
    np.testing.assert_array_equal(_run(new, feed)[0], _run(model, feed)[0])
    assert report["agreement"]["max_abs_diff"] == 0.0


def test_post_relu_uint8_zero_point_0_is_exact_up_to_127_steps():
    model = _single_qdq(relu=True)
    x = np.random.default_rng(1).uniform(-6.35, 6.35, (100, 10)).astype(np.float32)
    new, report = reencode_for_cpu(model, [{"x": x}], count_nodes=False)
    assert _zero_points(new) == {(0, "uint8")}
    np.testing.assert_array_equal(_run(new, {"x": x})[0], _run(model, {"x": x})[0])
    big = {"x": np.full((1, 10), 10.0, np.float32)}  # beyond 127 x scale: no longer clipped
    assert _run(model, big)[0].max() == pytest.approx(6.35)
    assert _run(new, big)[0].max() == pytest.approx(10.0)


def test_agreement_check_rejects_a_corrupted_scale(tiny, reencoded):
    model = copy.deepcopy(reencoded[0])
    # give one conv weight dequantizer its own, wrong, per-channel scales
    inits = {t.name: t for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
              and numpy_helper.to_array(inits[n.input[0]]).ndim == 4
              and numpy_helper.to_array(inits[n.input[0]]).shape[0] == 16)
    scale = numpy_helper.to_array(inits[dq.input[1]])
    wrong = scale * np.random.default_rng(0).uniform(0.1, 10, scale.shape).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(wrong, "corrupted_scale"))
    dq.input[1] = "corrupted_scale"
    with pytest.raises(AgreementError) as info:
        check_agreement(tiny, model, _feeds(n=2, seed=5))
    assert isinstance(info.value, TrtqatError) and isinstance(info.value, EngineBuildError)
    assert "\n" not in str(info.value) and "top-1 agreement" in str(info.value)


def test_build_fails_below_the_agreement_threshold(tiny):
    with pytest.raises(AgreementError, match="top-1 agreement"):
        reencode_for_cpu(tiny, _feeds(n=1), min_top1=1.01, count_nodes=False)


def test_several_quantizers_on_one_tensor_are_unified():
    model = make_tiny_qdq(residual_factor=0.8)  # block 1's identity has its own scale
    new, report = reencode_for_cpu(model, _feeds())
    assert report["passes"]["unified_scales"] == 1
    assert report["passes"]["max_scale_ratio"] == pytest.approx(1.25, rel=1e-3)
    assert report["compute_nodes"]["after"]["integer"]["QLinearAdd"] == 2
    unified = report["compute_nodes"]["after"]
    assert unified["float_total"] == 0 and unified["quantize_dequantize"] == 1
    # without unification the MaxPool between the two scales stays float, with Q/DQ around
    _, plain_report = reencode_for_cpu(model, _feeds(), unify=False)
    plain = plain_report["compute_nodes"]["after"]
    assert plain["float"].get("MaxPool") == 1
    assert plain["quantize_dequantize"] > unified["quantize_dequantize"]


def test_without_calibration_inputs_neighbour_scales_are_used(tiny):
    new, report = reencode_for_cpu(tiny, None)
    added = report["passes"]["output_quantizers_added"]
    assert added["calibrated"] == 0 and added["from_neighbours"] == 2
    assert "agreement" not in report
    assert report["compute_nodes"]["after"]["integer"]["QLinearAdd"] == 2
    assert check_agreement(tiny, new, _feeds(n=1, seed=9), min_top1=0.9)["top1_agreement"] >= 0.9


def test_float_model_is_left_alone():
    net = _Net(None)
    model = net.build()
    same, report = reencode_for_cpu(model, None)
    assert same is model and report["rewritten"] is False and "reason" in report


def test_prepare_model_step(tiny):
    options = SimpleNamespace(threads=1, ort_prepare="qdq", calib_feeds=_feeds(n=1))
    prepared = prepare_model(tiny, options)
    meta = {p.key: p.value for p in prepared.metadata_props}
    assert "trtqat.cpu_reencode" in meta and '"rewritten": true' in meta["trtqat.cpu_reencode"]
    assert count_compute_nodes(optimized_model(prepared, 1))["integer"]["QLinearConv"] == 6
    options = SimpleNamespace(threads=1, cpu_reencode=False)
    assert prepare_model(tiny, options) is tiny


def test_prepare_model_with_the_backends_build_options(tiny):
    specs = pytest.importorskip("trtqat.engines.specs")
    prepared = prepare_model(tiny, specs.BuildOptions(threads=1, ort_prepare="qdq"))
    counts = count_compute_nodes(optimized_model(prepared, 1))
    assert counts["integer"]["QLinearAdd"] == 2 and counts["float_total"] == 0


def test_default_ort_build_reencodes_on_cpu_and_keeps_feeds_out_of_the_file(tiny, tmp_path):
    from trtqat.engines import build_engine, load_engine

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny, path)
    shapes = {"shapes": {"input": tuple(_feeds(n=1)[0]["input"].shape)}}
    engine = build_engine(path, "ort", threads=1, calib_feeds=_feeds(n=2), **shapes)
    counts = count_compute_nodes(onnx.load_model_from_string(engine.payload))
    assert counts["integer"].get("QLinearConv") == 6 and counts["float_total"] == 0
    engine.save(tmp_path / "tiny.engine")
    loaded = load_engine(tmp_path / "tiny.engine")
    assert loaded.header["build_options"]["calib_feeds"] == 2
    assert loaded.build_options.calib_feeds is None
    plain = build_engine(path, "ort", threads=1, ort_prepare="none", **shapes)
    plain_counts = count_compute_nodes(onnx.load_model_from_string(plain.payload))
    assert plain_counts["integer"].get("QLinearConv", 0) < 6 and plain_counts["float_total"] > 0


def test_exec_calib_inputs_file(tmp_path):
    from trtqat.cli.exec_cmd import load_calib_inputs
    from trtqat.engines import OptionsError

    np.savez(tmp_path / "calib.npz", x=np.zeros((20, 3, 8, 8), np.float32))
    feeds = load_calib_inputs(str(tmp_path / "calib.npz"))
    assert [f["x"].shape[0] for f in feeds] == [8, 8, 4]
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(OptionsError, match="--calibInputs"):
        load_calib_inputs(str(tmp_path / "bad.npz"))


def test_int8_fp16_graph_is_left_as_it_is(tiny):
    from onnx import numpy_helper

    fp16 = copy.deepcopy(tiny)
    first = fp16.graph.initializer[0]
    fp16.graph.initializer.append(numpy_helper.from_array(
        numpy_helper.to_array(first).astype(np.float16), "fp16_const"))
    out, report = reencode_for_cpu(fp16, None, count_nodes=False)
    assert out is fp16 and not report["rewritten"] and "float16" in report["reason"]

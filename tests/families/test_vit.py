"""The ViT family: resolution, the replaced attention, Q/DQ placement, checkpoints, export."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import trtqat
from trtqat import families
from trtqat.errors import TrtqatError
from trtqat.families.vit import ViTSelfAttention, fuse_qkv_keys, replace_attention
from trtqat.quant.model_ops import disable_quantization, quantizers
from trtqat.quant.modules import QuantConv2d, QuantLinear
from trtqat.quant.plugins.matmul import QuantMatMul

SIZE = 16  # vit_tiny: 4x4 patches -> 16 tokens + the class token


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Compute-bound tests: one thread (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def family():
    return families.get("vit")


@pytest.fixture(scope="module")
def calibrated(family):
    """(float model, calibrated quantized copy, images)."""
    torch.manual_seed(0)
    model = family.build("vit_tiny", 10, image_size=SIZE).eval()
    q = family.quantize(copy.deepcopy(model)).eval()
    images = torch.randn(16, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    trtqat.collect_stats(q, [images[:8], images[8:]], progress=False)
    trtqat.compute_amax(q, "max")
    return model, q, images


def test_family_resolution():
    for name in ("vit", "vit_tiny", "vit_small", "vit_b_16", "vit_l_32", "vit_h_14"):
        assert families.of_model(name).name == "vit", name
    for name in ("resnet18", "mobilenet_v3_small", "maxvit_t", "swin_t"):
        assert families.of_model(name).name == "cnn", name
    assert families.of_model("minilm").name == "encoder"
    assert families.of_checkpoint({"model": {"family": "vit", "arch": "vit"}}).name == "vit"
    assert families.of_checkpoint({"model": {"arch": "resnet18"}}).name == "cnn"
    assert families.of_checkpoint({"model": {"family": "transformer"}}).name == "encoder"
    assert "vit" in families.names()
    assert families.names().index("vit") < families.names().index("cnn")


def test_build_sizes_and_errors(family):
    with torch.device("meta"):  # no weight initialisation: fast
        tv = family.build("vit_b_32", 7, image_size=64)
    assert tv.image_size == 64 and tv.patch_size == 32 and tv.heads.head.out_features == 7
    assert family.build("vit_tiny", 10).heads.head.weight.abs().sum() > 0  # not zeroed
    assert family.build("vit", 10).image_size == 32
    assert family.build("vit_tiny", 10, image_size=(16, 16), channels=1).conv_proj.in_channels == 1
    with pytest.raises(TrtqatError, match="not a multiple of .* patch size 4: use --image-size 20"):
        family.build("vit_tiny", 10, image_size=19)
    with pytest.raises(TrtqatError, match="square"):
        family.build("vit_tiny", 10, image_size=(16, 32))
    with pytest.raises(TrtqatError, match="unknown ViT"):
        family.build("resnet18")


@pytest.mark.parametrize("train", [False, True])
def test_attention_equals_multihead_attention(train):
    mha = nn.MultiheadAttention(24, 3, batch_first=True).train(train)
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    ours = ViTSelfAttention.from_mha(mha)
    x = torch.randn(2, 5, 24, requires_grad=True)
    want, _ = mha(x, x, x, need_weights=False)
    got, none = ours(x, x, x, need_weights=False)
    assert none is None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got.sum().backward()  # differentiable (QAT)
    assert x.grad is not None and ours.q_proj.weight.grad is not None
    _, w_ref = mha(x, x, x, need_weights=True)
    torch.testing.assert_close(ours(x, x, x, need_weights=True)[1], w_ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(TrtqatError, match="mask"):
        ours(x, x, x, attn_mask=torch.zeros(5, 5))


def test_quantized_float_forward_equals_original(calibrated):
    model, q, images = calibrated
    f = copy.deepcopy(q)
    disable_quantization(f)
    with torch.no_grad():
        torch.testing.assert_close(f(images), model(images), atol=1e-5, rtol=1e-5)
        assert not torch.equal(q(images), model(images))  # the quantizers do something


def test_quantizer_placement(calibrated):
    _, q, _ = calibrated
    assert not any(isinstance(m, nn.MultiheadAttention) for m in q.modules())
    for name, m in q.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            assert isinstance(m, (QuantLinear, QuantConv2d)), name
            assert not m.input_quantizer.disabled and m.weight_quantizer.axis == 0, name
        if isinstance(m, (nn.LayerNorm, nn.GELU, nn.Softmax)):
            assert not list(quantizers(m)), name
    attention = [m for m in q.modules() if isinstance(m, ViTSelfAttention)]
    assert len(attention) == 2
    for m in attention:
        assert isinstance(m.matmul_qk, QuantMatMul) and isinstance(m.matmul_av, QuantMatMul)
        assert m.matmul_qk.input_quantizer.amax is not None
        assert m.matmul_av.other_quantizer.amax is not None
    names = [n for n, _ in quantizers(q)]
    assert "encoder.layers.encoder_layer_1.self_attention.matmul_qk._other_quantizer" in names
    assert len(names) == 2 + 2 * (4 * 2 + 2 * 2 + 2 * 2) + 2  # conv, 2 blocks, head


def test_skip_layers_glob(family):
    model = family.quantize(family.build("vit_tiny", 10, image_size=SIZE),
                            ["*.encoder_layer_0.self_attention"])
    off = {n for n, qz in quantizers(model) if qz.disabled}
    assert off and all(".encoder_layer_0.self_attention." in n for n in off)
    assert len(off) == 12  # four projections x 2, two matmuls x 2
    with pytest.raises(TrtqatError, match="matches no quantized layer"):
        family.quantize(family.build("vit_tiny", 10, image_size=SIZE), ["nothing.*"])


def _spec(quantized: bool) -> dict:
    return {"family": "vit", "arch": "vit_tiny", "num_classes": 10, "image_size": SIZE,
            "quantized": quantized, "skip_layers": []}


def test_load_round_trip(family, calibrated):
    model, q, images = calibrated
    ckpt = {"model": _spec(True), "state_dict": q.state_dict()}
    back = family.load(ckpt).eval()
    float_back = family.load(ckpt, quantized=False).eval()
    assert not list(quantizers(float_back))
    resaved = {"model": _spec(False), "state_dict": float_back.state_dict()}  # split keys
    assert "encoder.layers.encoder_layer_0.self_attention.q_proj.weight" in resaved["state_dict"]
    ptq_start = family.load({"model": _spec(False), "state_dict": model.state_dict()},
                            quantized=True)
    assert all(qz.amax is None for n, qz in quantizers(ptq_start) if "_input" in n)
    with torch.no_grad():
        torch.testing.assert_close(back(images), q(images))
        torch.testing.assert_close(float_back(images), model(images), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(family.load(resaved)(images), model(images), atol=1e-5,
                                   rtol=1e-5)
    fused = {k for k in fuse_qkv_keys(q.state_dict()) if "_quantizer." not in k}
    assert fused == set(model.state_dict())
    with pytest.raises(TrtqatError, match="image-size"):
        family.load({"model": {**_spec(True), "image_size": 32}, "state_dict": q.state_dict()})


def test_replace_attention_counts_modules(family):
    model = family.build("vit_tiny", 10, image_size=SIZE)
    assert replace_attention(model) == 2 and replace_attention(model) == 0


def test_export_int8_lint_and_ort(calibrated, family, tmp_path):
    from trtqat.engines import build_engine
    from trtqat.engines.ort_qdq import count_compute_nodes, optimized_model, reencode_for_cpu
    from trtqat.export import export_onnx

    _, q, images = calibrated
    path = tmp_path / "vit_int8.onnx"
    result = export_onnx(q, images[:2], path, variant="int8", validate=True,
                         validation_data=[images])
    assert result.lint is not None and not result.lint.findings
    graph = onnx.load(path).graph
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type in ("LayerNormalization", "Softmax", "Erf"):
            assert producer[node.input[0]].op_type != "DequantizeLinear", node.name
        if node.op_type == "MatMul":  # every MatMul, attention's included, reads two DQ
            kinds = {producer[i].op_type for i in node.input if i in producer}
            assert kinds <= {"DequantizeLinear", "Transpose"}, node.name
    engine = build_engine(path, "ort", threads=1, ort_prepare="none")
    with engine.runner(threads=1) as runner:
        got = next(iter(runner.infer({graph.input[0].name: images.numpy()}).values()))
    with torch.no_grad():
        want = q(images).numpy()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
    # the engine hint's MatMul rewrite: the attention matmuls run on integer kernels
    assert "fuse_matmul_epilogues" in family.engine_hints().ort_rewrites
    cpu_model, _ = reencode_for_cpu(onnx.load(path), None, count_nodes=False)
    integer = count_compute_nodes(optimized_model(cpu_model, threads=1))["integer"]
    assert integer.get("QLinearMatMul", 0) + integer.get("MatMulIntegerToFloat", 0) >= 12


def test_export_carries_engine_hints_and_keeps_fp16_sensitive_ops_float32(calibrated, family,
                                                                          tmp_path):
    from trtqat.engines.hints import read_hints
    from trtqat.export import export_onnx
    from trtqat.export.onnx_export import image_plan

    _, q, images = calibrated
    plan = family.stamp_plan(image_plan(images[:2], validation_data=[images]))
    assert plan.metadata[families.FAMILY_KEY] == "vit"
    for variant in ("int8", "int8-fp16"):
        path = tmp_path / f"vit_{variant}.onnx"
        result = export_onnx(q, plan, path, variant=variant, opset=19)
        assert result.lint is not None and not result.lint.findings
        model = onnx.load(path)
        assert read_hints(model) == family.engine_hints()
        producer = {o: n for n in model.graph.node for o in n.output}
        sensitive = [n for n in model.graph.node
                     if n.op_type in family.engine_hints().fp16_sensitive_ops]
        assert len(sensitive) == 2 * 2 + 2 + 1  # per layer 2 LayerNorms + Softmax; final LN
        # LayerNorms read a Cast to float32 in the fp16 variant and the DQ-free input in int8
        fed_by_cast = [producer[n.input[0]].op_type == "Cast" for n in sensitive
                       if n.op_type == "LayerNormalization"]
        assert all(fed_by_cast) if variant == "int8-fp16" else not any(fed_by_cast)


def test_recipes_follow_the_fp32_run(family):
    from types import SimpleNamespace

    fields = ("epochs", "lr", "min_lr", "momentum", "weight_decay", "opt", "label_smoothing",
              "data", "image_size", "batch_size")
    train = family.recipe("train", None)
    assert (train["opt"], train["lr"], train["epochs"]) == ("adamw", 2e-3, 30)
    assert family.recipe("calibrate", None) == {"method": "mse"}
    cfg = SimpleNamespace(**dict.fromkeys(fields))
    qat = family.recipe("qat", cfg, {"train_args": train})
    assert (qat["epochs"], qat["opt"], qat["loss"]) == (6, "adamw", "ce")
    assert qat["lr"] == pytest.approx(3e-4) and qat["min_lr"] == pytest.approx(3e-6)
    # without a recorded FP32 run (calibrated from a float model): the ViT train recipe
    bare = family.recipe("qat", cfg, {})
    assert (bare["lr"], bare["opt"], bare["batch_size"]) == (pytest.approx(3e-4), "adamw", 64)
    # a longer FP32 run gets a longer QAT; the user's options win
    assert family.recipe("qat", cfg, {"train_args": {**train, "epochs": 100}})["epochs"] == 20
    mine = SimpleNamespace(**{**vars(cfg), "epochs": 2, "lr": 1e-5})
    assert [family.recipe("qat", mine, {"train_args": train})[k] for k in ("epochs", "lr")] == [
        2, 1e-5]


@pytest.mark.parametrize("argv, want", [
    (["--model", "vit_tiny"], {"opt": "adamw", "lr": 2e-3, "weight_decay": 0.05, "epochs": 30,
                               "batch_size": 64}),
    ([], {"opt": "sgd", "lr": 0.05, "weight_decay": 5e-4, "epochs": 15, "batch_size": 32}),
    (["--model", "vit", "--lr", "1e-3", "-b", "16", "--opt", "sgd"],
     {"opt": "sgd", "lr": 1e-3, "weight_decay": 0.05, "epochs": 30, "batch_size": 16}),
])
def test_train_command_takes_the_family_recipe(argv, want):
    """`trtqat train --model vit` trains with the ViT recipe unless an option says otherwise."""
    from trtqat.cli import build_parser
    from trtqat.cli.options import config_from
    from trtqat.stages.train import TrainConfig

    cfg = config_from(TrainConfig, build_parser().parse_args(["train", *argv]))
    assert {k: getattr(cfg, k) for k in want} == want

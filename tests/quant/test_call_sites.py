"""Modules FX cannot trace get their matrix products quantized at the call sites
(trtqat.quant.plugins.calls): Q/DQ on both operands in the ONNX, integer in the ORT engine."""

from __future__ import annotations

import logging

import onnx
import torch
import torch.nn.functional as F
from torch import nn

import trtqat
from trtqat.quant.placement import place
from trtqat.quant.plugins.calls import call_sites
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.tensor_quantizer import TensorQuantizer


def _gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)  # a free helper function: still the owner's own code


class LinearAttention(nn.Module):
    """LiteMLA-like linear attention, then MobileViT's fusion of the input with the result;
    the branch on the input's shape stops FX."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Conv2d(width, 3 * width, 1)
        self.proj = nn.Conv2d(width, width, 1)
        self.fuse = nn.Conv2d(2 * width, width, 1)

    def _attn(self, q, k, v):
        kv = k.transpose(-1, -2) @ v
        return _gram(q, kv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).flatten(2).transpose(1, 2).chunk(3, -1)
        if h % 2 == 0:
            out = self._attn(F.relu(q), F.relu(k), v)
        else:
            out = v
        out = self.proj(out.transpose(1, 2).reshape(b, c, h, w))
        return self.fuse(torch.cat((x, out), 1))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.attn = LinearAttention()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(F.relu(self.stem(x))).mean((2, 3)))


def test_untraceable_module_matmuls_get_qdq_and_run_integer(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    model = trtqat.quantize(Net().eval(), forward_loop=[x])
    sites = {n.rsplit(".", 1)[-1]: m for n, m in call_sites(model)}
    assert sorted(sites) == ["_attn_l1_matmul", "_gram_l1_matmul", "forward_l8_cat"]
    assert all(sites[n].input_quantizer.amax is not None and
               sites[n].other_quantizer.amax is not None for n in sites if "matmul" in n)
    # the Concat's inputs and its consumer share one scale with the layer reading its input
    shared = sites["forward_l8_cat"]._input_quantizer
    assert model.attn.qkv._input_quantizer is shared is model.attn.fuse._input_quantizer
    assert "attn._trtqat_calls.sites._gram_l1_matmul._other_quantizer  [calls]" in \
        trtqat.describe(model)
    result = trtqat.export_onnx(model, x[:2], tmp_path / "m.onnx", variant="int8")
    assert result.passed  # ONNX Runtime matches the fake-quant PyTorch model
    graph = onnx.load(str(result.path)).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 2
    assert all(producer.get(i) == "DequantizeLinear" for n in matmuls for i in n.input)
    assert not result.lint.warnings, result.lint.lines()
    engine = trtqat.build_engine(result.path, threads=1)
    from trtqat.engines.ort_qdq import count_compute_nodes

    counts = count_compute_nodes(onnx.load_model_from_string(engine.payload))
    assert not {"MatMul", "FusedMatMul", "Gemm"} & set(counts["float"]), counts
    integer = counts["integer"]
    assert integer.get("QLinearMatMul", 0) + integer.get("MatMulIntegerToFloat", 0) >= 2


class Products(nn.Module):
    """A branch on a tensor's value (FX cannot trace it), products inside and beside a
    traced child that has its own QuantMatMul."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.weight = nn.Parameter(torch.randn(5, 6))
        self.child = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.mean() > -1e9:
            y = torch.bmm(y, y.transpose(1, 2)) @ y
        y = F.linear(y, self.weight)
        return F.scaled_dot_product_attention(y, y, y) + self.child(y)


class Inner(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a @ a.transpose(1, 2) @ a


def test_call_sites_skip_children_survive_a_checkpoint_and_compile_as_float(caplog):
    torch.manual_seed(0)
    batches = [torch.randn(2, 3, 6) for _ in range(2)]
    model = trtqat.quantize(Products().eval(), {"method": "max"}, forward_loop=batches)
    sites = {n.split("sites.", 1)[1]: type(m).__name__ for n, m in call_sites(model)}
    assert sites == {"forward_l3_matmul": "QuantMatMul", "forward_l3_matmul_1": "QuantMatMul",
                     "forward_l4_linear": "QuantLinearCall",
                     "forward_l5_sdpa": "QuantSDPA"}
    # the traced child keeps its own QuantMatMul, not quantized a second time by the parent
    assert sum(isinstance(m, QuantMatMul) for m in model.child.modules()) == 2
    assert model._trtqat_calls.sites.forward_l4_linear._weight_quantizer.amax.numel() == 5
    with torch.no_grad():
        expected = model(batches[0])
    restored = Products().eval()
    place(restored)
    restored.load_state_dict(model.state_dict())  # sites created from the checkpoint's keys
    with torch.no_grad():
        torch.testing.assert_close(restored(batches[0]), expected)
    # torch.compile cannot run the call sites: it computes those products in float, as the
    # eager model does with them disabled (not something in between), and says so
    for _, site in call_sites(restored):
        for q in site.modules():
            if isinstance(q, TensorQuantizer):
                q.disable()
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        float_sites = restored(batches[0])
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager")(batches[0])
    torch.testing.assert_close(compiled, float_sites)
    assert "torch.compile runs Products's own" in caplog.text


class Projected(nn.Module):
    """Untraceable (a branch on a shape) and ending in a projection, as timm's LiteMLA."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.qkv(x)
        if x.shape[-1] % 2 == 0:
            out = out @ out.transpose(-1, -2)
        out = self.proj(out)
        return out


class Squared(Projected):
    """An op after the projection: its output is no conv's any more."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) ** 2


class Residual(nn.Module):
    def __init__(self, main: nn.Module) -> None:
        super().__init__()
        self.main, self.shortcut = main, nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x) + self.shortcut(x)


def test_residual_add_after_an_untraceable_module_quantizes_the_identity(tmp_path):
    """Blocks chained so that the second one's identity is the first one's sum (no conv
    either side, as efficientvit's stages.N.blocks.2): the Add still gets its Q/DQ, on the
    identity, because the untraceable main branch returns its projection conv's output."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Residual(Projected()),
                          Residual(Projected()), Residual(Squared())).eval()
    x = torch.randn(2, 3, 8, 8)
    trtqat.quantize(model, {"method": "max"}, forward_loop=[x])
    seen = []
    for block in (model[1], model[2]):
        block.residual_quantizer.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(x)
    # on the shortcut (the block's input), not on the projection's output
    assert len(seen) == 2 and torch.equal(seen[1], model[1](model[0](x)))
    assert not hasattr(model[3], "residual_quantizer")  # out * out: nothing to fuse
    result = trtqat.export_onnx(model[:3], x, tmp_path / "r.onnx", variant="int8")
    assert result.passed and not result.lint.warnings, result.lint.lines()
    # a checkpoint calibrated before (placement graph-2) is rebuilt as it was calibrated
    from trtqat.families.cnn.models import quantize_classifier

    old = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Residual(Projected()),
                        Residual(Projected())).eval()
    quantize_classifier(old, placement="graph-2")
    assert not hasattr(old[2], "residual_quantizer")

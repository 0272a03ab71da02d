"""torch.ops.trtqat.fake_quant under torch.compile: no graph break, decomposed for inductor,
same values and gradients as eager; and the fake-quant input checks."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

import trtqat
from trtqat import quant_modules
from trtqat.errors import QuantInputError, TrtqatError
from trtqat.quant import fake_quant_op
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.functional import fake_tensor_quant, fake_tensor_quant_learnable
from trtqat.quant.tensor_quantizer import TensorQuantizer


@pytest.fixture(autouse=True)
def _fresh_dynamo(one_thread):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _capture_backend(graphs: list):
    """An AOT-autograd backend with inductor's decompositions that records its fx graphs."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table

    def compiler(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=compiler, bw_compiler=compiler,
                                     decompositions=select_decomp_table())
    return backend


def _tiny(learn: bool, axis=None) -> nn.Module:
    torch.manual_seed(0)
    amax = torch.rand(1, 6) + 0.5 if axis is not None else 1.0
    quant = TensorQuantizer(QuantDescriptor(amax=amax, axis=axis, learn_amax=learn))
    return nn.Sequential(nn.Linear(5, 6), quant, nn.ReLU(), nn.Linear(6, 3))


@pytest.mark.parametrize("learn,axis", [(False, None), (False, 1), (True, None)])
def test_compiled_graphs_hold_plain_aten_ops_and_match_eager(learn, axis):
    model = _tiny(learn, axis)
    x = torch.randn(7, 5) * 3  # some values clipped
    ref = model(x)
    ref.square().sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    graphs: list = []
    compiled = torch.compile(model, backend=_capture_backend(graphs), fullgraph=True)
    out = compiled(x)
    out.square().sum().backward()
    torch.testing.assert_close(out, ref)
    for p, g in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g)
    assert len(graphs) == 2  # forward and backward
    for gm in graphs:  # inductor sees elementwise aten ops it can fuse, not an opaque call
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not any("trtqat" in t for t in targets), targets
        assert "aten.round.default" in targets


def test_decompositions_reach_inductor_compiled_after_another_model(monkeypatch):
    """Inductor copies its decomposition table the first time it compiles anything; a model
    compiled before the first quantizer (a fresh process, the suite's other files) must not
    leave the quantizer opaque to it."""
    from torch._inductor.decomposition import decompositions, select_decomp_table

    monkeypatch.setattr(fake_quant_op, "_DECOMPOSED", False)
    for op in (torch.ops.trtqat.fake_quant.default, torch.ops.trtqat.fake_quant_grad.default,
               torch.ops.trtqat.fake_quant_learnable_grad.default):
        monkeypatch.delitem(decompositions, op, raising=False)
    select_decomp_table()  # what compiling an unquantized model first leaves behind
    test_compiled_graphs_hold_plain_aten_ops_and_match_eager(False, None)


def test_custom_op_is_registered_with_fake_and_autograd():
    x = torch.randn(3, 4, requires_grad=True)
    amax = torch.tensor(0.5, requires_grad=True)
    torch.library.opcheck(torch.ops.trtqat.fake_quant.default, (x, amax, -127, 127))
    y = fake_quant_op.fake_quant(x, amax, -127, 127)
    y.sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    ref_a = amax.detach().clone().requires_grad_(True)
    fake_tensor_quant_learnable(ref_x, ref_a).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=0, atol=0)
    torch.testing.assert_close(amax.grad, ref_a.grad)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        meta = fake_quant_op.fake_quant(torch.empty(2, 3), torch.tensor(1.0), 0, 255)
    assert meta.shape == (2, 3)


def test_quantized_resnet18_traces_without_graph_break():
    with quant_modules.initialized():
        model = torchvision.models.resnet18(weights=None, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    trtqat.collect_stats(model, [x], progress=False)
    trtqat.compute_amax(model, "max")
    explain = torch._dynamo.explain(model.train())(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    # in training each call sits in an activation checkpoint (a subgraph): count them all
    code = "".join(m.code for m in explain.graphs[0].modules() if hasattr(m, "code"))
    assert code.count("trtqat.fake_quant") >= 2 * 20  # input and weight quantizer of each conv


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool])
def test_non_float_input_is_refused_with_one_clear_line(dtype):
    with pytest.raises(QuantInputError, match=r"floating-point tensor, got torch\.\w+; cast") as err:
        fake_tensor_quant(torch.ones(4, dtype=dtype), 1.0)
    assert isinstance(err.value, TrtqatError) and isinstance(err.value, TypeError)
    assert "\n" not in str(err.value)
    quantizer = TensorQuantizer(QuantDescriptor(amax=1.0, learn_amax=True))
    with pytest.raises(QuantInputError):
        quantizer(torch.ones(4, dtype=dtype))

"""Quantized conv/linear on the lean-backward path (issue 35): gradients bit-identical to the
plain path (quantizer, then the layer), fewer bytes kept for backward, and the plain path
wherever the quantizers are not in their common QAT state."""

import contextlib
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trtqat import nn as quant_nn
from trtqat.quant import export_mode, lean_backward
from trtqat.tensor_quant import QuantDescriptor

LEAN = "_LeanQuantFnBackward"
HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def lean_on_the_cpu():
    """These tests run the lean path on CPU tensors (by default it runs on GPU tensors only)."""
    previous = lean_backward.set_enabled(True)
    yield
    lean_backward.set_enabled(previous)


def test_by_default_only_gpu_tensors_take_the_lean_path():
    """The default leaves CPU steps on the plain path (the codes cost CPU time, and memory
    binds on GPUs); a CPU layer then keeps the plain path's autograd nodes."""
    lean_backward.set_enabled(lean_backward.GPU)
    assert lean_backward.enabled() == "gpu"
    torch.manual_seed(0)
    layer = _calibrate(quant_nn.QuantConv2d(3, 4, 3), torch.randn(2, 3, 8, 8))
    y = layer(torch.randn(2, 3, 8, 8, requires_grad=True))
    assert y.grad_fn.name() != LEAN


def _calibrate(layer: nn.Module, x: torch.Tensor) -> nn.Module:
    """Ranges that clip: the input's at half its max, the weight's per channel at 0.7."""
    layer._input_quantizer.amax = x.detach().abs().amax() * 0.5
    w = layer.weight.detach()
    layer._weight_quantizer.amax = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True) * 0.7
    return layer


def _net(kind: str, x: torch.Tensor, channels_last: bool = False) -> nn.Module:
    """A float layer, then ReLU (in place, so it keeps its result), then the quantized layer."""
    if kind == "conv":
        first = nn.Conv2d(3, 6, 3, padding=1)
        layer = quant_nn.QuantConv2d(6, 5, 3, stride=2, padding=1, bias=True)
    elif kind == "conv-dw":  # grouped and dilated, no bias
        first = nn.Conv2d(3, 6, 3, padding=1)
        layer = quant_nn.QuantConv2d(6, 6, 3, padding=2, dilation=2, groups=3, bias=False)
    elif kind == "conv1d":
        first = nn.Conv1d(3, 6, 3, padding=1)
        layer = quant_nn.QuantConv1d(6, 5, 3, stride=2, bias=True)
    else:
        first = nn.Linear(x.shape[-1], 12)
        layer = quant_nn.QuantLinear(12, 7, bias=True)
    net = nn.Sequential(first, nn.ReLU(inplace=True), layer)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    with torch.no_grad():
        _calibrate(layer, net[1](first(x)))
    return net


def _step(net: nn.Module, x: torch.Tensor, lean: bool, amp: bool, skip_first: bool):
    """Output and every gradient of one step, on the lean or the plain path."""
    net.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    previous = lean_backward.set_enabled(lean)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            y = net[2](x) if skip_first else net(x)
        # a gradient that is not all ones, so a mixed-up operand shows
        (y.float() * torch.linspace(-1, 2, y.numel()).reshape(y.shape)).sum().backward()
    finally:
        lean_backward.set_enabled(previous)
    assert (y.grad_fn.name() == LEAN) == lean
    return [y, x.grad] + [p.grad for p in net.parameters() if p.grad is not None]


@pytest.mark.parametrize("kind", ["conv", "linear", "linear3d", "conv-cl", "conv-dw",
                                  "conv1d"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("source", ["relu", "leaf"])  # x kept as it is / as int8 codes
def test_gradients_equal_the_plain_path_bit_for_bit(backend, kind, amp, source):
    torch.manual_seed(0)
    shape = {"conv": (2, 3, 9, 9), "conv-cl": (2, 3, 9, 9), "conv-dw": (2, 3, 9, 9),
             "conv1d": (2, 3, 11), "linear": (4, 10), "linear3d": (2, 3, 10)}[kind]
    x = torch.randn(shape)
    if kind == "conv-cl":
        x = x.to(memory_format=torch.channels_last)
    net = _net({"conv-cl": "conv", "linear3d": "linear"}.get(kind, kind), x,
               channels_last=kind == "conv-cl")
    if source == "leaf":  # the quantized layer alone, on a tensor no op keeps
        x = net[1](net[0](x)).detach()
        _calibrate(net[2], x)
    plain = _step(net, x, False, amp, source == "leaf")
    lean = _step(net, x, True, amp, source == "leaf")
    assert len(plain) == len(lean) >= 3
    for i, (a, b) in enumerate(zip(plain, lean)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"tensor {i} differs"
    inp = x if source == "leaf" else net[1](net[0](x))
    assert (inp.abs() > net[2]._input_quantizer.amax).any(), "no input element was clipped"


def saved_bytes(model: nn.Module, x: torch.Tensor, amp: bool = False) -> int:
    """Bytes of the distinct non-parameter storages one forward keeps for backward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        y = model(x)
    y.float().sum().backward()
    return sum(seen.values())


def _tiny(quantized: bool) -> nn.Sequential:
    conv = quant_nn.QuantConv2d if quantized else nn.Conv2d
    linear = quant_nn.QuantLinear if quantized else nn.Linear
    torch.manual_seed(0)
    return nn.Sequential(conv(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                         conv(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2), conv(16, 16, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Flatten(), linear(16 * 8 * 8, 10))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_lean_path_keeps_fewer_bytes_than_the_plain_one_and_near_fp32(amp):
    x = torch.randn(4, 3, 16, 16)
    qat = _tiny(True).train()
    for m in qat.modules():
        if isinstance(m, quant_nn.QuantConv2d | quant_nn.QuantLinear):
            m._input_quantizer.amax = torch.tensor(4.0)
            w = m.weight.detach()
            m._weight_quantizer.amax = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True)
    with lean_backward.disabled():
        plain = saved_bytes(qat, x, amp)
    lean = saved_bytes(qat, x, amp)
    fp32 = saved_bytes(_tiny(False).train(), x, amp)
    assert lean < plain
    assert lean <= 1.2 * fp32, (lean, fp32, plain)


def _conv() -> quant_nn.QuantConv2d:
    layer = quant_nn.QuantConv2d(3, 4, 3)
    x = torch.randn(2, 3, 6, 6)
    return _calibrate(layer, x)


def _path(layer: nn.Module, x=None) -> str:
    x = torch.randn(2, 3, 6, 6, requires_grad=True) if x is None else x
    return layer(x).grad_fn.name()


@pytest.mark.parametrize("change", ["calib", "disable_quant", "disable", "learn_amax",
                                    "hook", "unsigned", "no_amax", "padding_mode",
                                    "switched_off", "no_grad", "export_mode", "fb_fake_quant"])
def test_plain_path_wherever_the_quantizers_do_more(change):
    layer = _conv()
    assert _path(layer) == LEAN
    q = layer._input_quantizer
    context = contextlib.nullcontext()
    if change == "calib":
        q.enable_calib()
    elif change == "disable_quant":
        layer._weight_quantizer.disable_quant()
    elif change == "disable":
        q.disable()
    elif change == "learn_amax":
        layer._weight_quantizer.init_learn_amax()
    elif change == "hook":
        q.register_forward_hook(lambda *a: None)
    elif change == "unsigned":
        q.unsigned = True
    elif change == "no_amax":
        layer._input_quantizer = quant_nn.TensorQuantizer(QuantDescriptor())
    elif change == "padding_mode":
        layer.padding_mode = "reflect"
    elif change == "switched_off":
        context = lean_backward.disabled()
    elif change == "no_grad":
        context = torch.no_grad()
    elif change == "export_mode":
        context = export_mode.enabled()
    elif change == "fb_fake_quant":
        context = _fb_fake_quant()
    with context:
        x = torch.randn(2, 3, 6, 6).abs()
        y = layer(x.requires_grad_(change != "no_grad"))
    assert y.grad_fn is None if change == "no_grad" else y.grad_fn.name() != LEAN


@contextlib.contextmanager
def _fb_fake_quant():
    before = quant_nn.TensorQuantizer.use_fb_fake_quant
    quant_nn.TensorQuantizer.use_fb_fake_quant = True
    try:
        yield
    finally:
        quant_nn.TensorQuantizer.use_fb_fake_quant = before


def test_mask_path_gradients_equal_the_plain_path():
    """The CUDA path (Triton kernels keeping a bit-packed mask) under Triton's interpreter."""
    sys.path.insert(0, str(HERE))
    from triton_cases import run_in_interpreter

    results = run_in_interpreter(HERE / "lean_mask_cases.py")
    assert results and all(v == "ok" for v in results.values()), results



def test_onnx_export_never_takes_the_lean_path(tmp_path, monkeypatch):
    """torch.onnx.export in training mode with gradients on: Q/DQ nodes, as before."""
    import onnx

    def refuse(*args):
        raise AssertionError("the lean path ran during ONNX export")

    monkeypatch.setattr(lean_backward._LeanQuantFn, "apply", refuse)
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), nn.ReLU(), nn.Flatten(),
                          quant_nn.QuantLinear(4 * 4 * 4, 3)).train()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        _calibrate(model[0], x)
        _calibrate(model[3], model[2](model[1](model[0](x))))
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False,
                      training=torch.onnx.TrainingMode.PRESERVE)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("QuantizeLinear") >= 4 and "Conv" in ops and "Gemm" in ops, ops


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_the_plain_gradients(reentrant):
    """Checkpointing recomputes the forward under saved-tensor hooks: the lean path must
    keep the same tensors both times (and not unpack another node's saved tensors)."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9)
    net = _net("conv", x)
    grads = []
    for lean in (False, True):
        net.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_()
        with lean_backward.disabled() if not lean else contextlib.nullcontext():
            checkpoint(net, xx, use_reentrant=reentrant).sum().backward()
        grads.append([xx.grad] + [p.grad for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("source", ["relu", "leaf"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_input_reaches_the_gradients_as_on_the_plain_path(source, bad):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9)
    net = _net("conv", x)
    if source == "leaf":
        x = net[1](net[0](x)).detach()
        _calibrate(net[2], x)
    x[0, 1, 2, 3] = bad
    plain = _step(net, x, False, False, source == "leaf")
    lean = _step(net, x, True, False, source == "leaf")
    if bad != bad:  # a NaN survives fake quantization (an infinity is clipped)
        assert not all(bool(t.isfinite().all()) for t in plain)
    for a, b in zip(plain, lean):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)

"""The compiled fake-quant kernels (trtqat._C) against the pure-PyTorch reference (_fused),
float32 and bfloat16 (what CPU autocast hands the activation quantizers)."""

from __future__ import annotations

import pytest
import torch

from trtqat.quant import _fused, _kernels
from trtqat.quant.functional import fake_tensor_quant, quant_bounds

_C = _kernels._C
pytestmark = pytest.mark.skipif(
    _C is None, reason=f"compiled fake-quant extension not built ({_kernels.EXTENSION_ERROR})"
)

# (num_bits, unsigned, narrow_range)
FORMATS = [
    (8, False, True),
    (8, False, False),
    (8, True, False),
    (4, False, True),
    (4, False, False),
    (4, True, False),
    (16, False, False),
    (16, True, False),
]

# (shape, axis or None for per tensor)
LAYOUTS = [
    ((), None),
    ((0,), None),
    ((1,), None),
    ((7,), None),
    ((3, 5, 7, 11), None),
    ((2, 32, 33, 33), None),  # > one parallel grain (65536)
    ((64, 3, 3, 3), 0),  # conv weight
    ((16, 24, 3, 3), 1),  # conv-transpose weight
    ((4, 16, 6, 6), 1),  # activation per channel
    ((4, 9, 5), 2),  # channel innermost (inner == 1)
    ((251, 300), 1),  # inner == 1, grains start mid-row
    ((3, 25000), 0),  # grains start mid-row
    ((2, 5, 1, 3), 1),
]

EXACT = {"rtol": 0, "atol": 0, "equal_nan": True}


def _amax_for(x: torch.Tensor, axis: int | None, gen: torch.Generator) -> torch.Tensor:
    if axis is None:
        return torch.rand((), generator=gen) * 2 + 0.25
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return torch.rand(shape, generator=gen) * 2 + 0.05


def _ref_mask(x, amax, qmin, qmax):
    q = torch.round(x.float() / _fused.scale_of(amax, qmax))
    return (q >= qmin) & (q <= qmax)


def _check(x, amax, qmin, qmax):
    out = _C.fake_quant_forward(x, amax, qmin, qmax)
    assert out is not None, "the kernel refused inputs it should handle"
    y, clipped = out
    ref, _ = _fused.fake_quant_forward(x, amax, qmin, qmax)
    assert y.dtype == x.dtype and y.shape == x.shape and y.stride() == ref.stride()
    torch.testing.assert_close(y, ref, **EXACT)
    mask = _ref_mask(x, amax, qmin, qmax)
    assert clipped == bool((~mask).any())
    grad = torch.randn(x.shape, dtype=x.dtype).contiguous(memory_format=_format_of(x))
    g = _C.fake_quant_grad_input(grad, x, amax, qmin, qmax)
    assert g is not None
    torch.testing.assert_close(g, _fused.fake_quant_grad_input(grad, x, amax, qmin, qmax), **EXACT)
    torch.testing.assert_close(g, grad * mask, **EXACT)
    return clipped


def _format_of(x):
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def test_backend_is_cpp():
    assert _kernels.BACKEND == "cpp"
    assert "cpp" in _kernels.available_backends()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_bits,unsigned,narrow", FORMATS)
@pytest.mark.parametrize("shape,axis", LAYOUTS)
def test_random_values_match_reference(shape, axis, num_bits, unsigned, narrow, dtype):
    gen = torch.Generator().manual_seed(hash((shape, axis, num_bits, unsigned, narrow)) % 2**31)
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow)
    x = (torch.randn(shape, generator=gen) * 1.5).to(dtype)  # a good part lies beyond amax
    amax = _amax_for(x, axis, gen)
    _check(x, amax, qmin, qmax)


@pytest.mark.parametrize("num_bits,unsigned,narrow", FORMATS)
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_ties_round_half_to_even(num_bits, unsigned, narrow, axis):
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow)
    # power-of-two steps make x / scale exact, so every x is exactly k + 0.5 steps
    exps = torch.tensor([-3.0, -1.0, 2.0])
    steps = torch.exp2(exps)
    k = torch.arange(qmin - 3, qmax + 3, dtype=torch.float32)
    if k.numel() > 4000:
        k = torch.cat([k[:1000], k[-1000:]])
    halves = k + 0.5
    if axis is None:
        amax = torch.tensor(qmax * 0.25)
        x = halves * 0.25
        x = torch.cat([x, -x, k * 0.25])
    else:
        x = torch.stack([halves * s for s in steps] + [k * s for s in steps])  # (6, n)
        x = x.reshape(2, 3, -1).transpose(0, 1).contiguous()  # (3, 2, n): channel = step
        if axis == 1:
            x = x.transpose(0, 1).contiguous()  # (2, 3, n)
        shape = [1, 1, 1]
        shape[axis] = 3
        amax = (steps * qmax).reshape(shape)
    assert bool(((x / _fused.scale_of(amax, qmax)).abs().frac() == 0.5).any())
    assert _check(x, amax, qmin, qmax)  # values beyond the range were clipped


def test_values_inside_range_report_no_clipping():
    x = torch.linspace(-1, 1, 10001)
    assert _check(x, torch.tensor(1.0), -127, 127) is False
    w = torch.randn(32, 8, 3, 3)
    amax = w.abs().amax(dim=(1, 2, 3), keepdim=True)
    assert _check(w, amax, -127, 127) is False
    # the same weight one step further (round(x/s) = qmax + 1) is clipped
    assert _check(w * (128 / 127) * 1.0001, amax, -127, 127) is True


@pytest.mark.parametrize("num_bits,unsigned,narrow", [(8, False, True), (8, True, False)])
def test_zero_amax_channels(num_bits, unsigned, narrow):
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow)
    w = torch.randn(6, 4, 3, 3)
    w[2] = 0
    w[4, 0, 0, 0] = 1e-39  # a subnormal in a channel whose range is 0
    amax = w.abs().amax(dim=(1, 2, 3), keepdim=True)
    amax[4] = 0
    _check(w, amax, qmin, qmax)
    x = torch.randn(2, 6, 5)
    _check(x, torch.zeros(1, 6, 1), qmin, qmax)


def test_non_finite_inputs():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30, -1e-30, 0.3])
    assert _check(x, torch.tensor(1.0), -127, 127) is True
    x = torch.tensor([[0.1, 0.2], [float("nan"), 0.1]])
    assert _check(x, torch.tensor([[1.0], [1.0]]), -127, 127) is True
    assert _check(x, torch.tensor([[1.0], [float("nan")]]), -127, 127) is True


def test_per_tensor_channels_last_and_amax_shapes():
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    _check(x, torch.tensor(1.5), -128, 127)
    _check(x, torch.full((1, 1, 1, 1), 1.5), -128, 127)
    _check(torch.randn(3, 4), torch.tensor([0.7]), -127, 127)  # amax of shape (1,)


@pytest.mark.parametrize(
    "x,amax",
    [
        (torch.randn(4, 6).half(), torch.tensor(1.0)),  # neither float32 nor bfloat16
        (torch.randn(4, 6).double(), torch.ones(4, 1)),
        (torch.randn(4, 6).bfloat16(), torch.ones(4, 1, dtype=torch.bfloat16)),  # amax not float32
        (torch.randn(4, 6), torch.tensor(1.0, dtype=torch.float64)),  # amax not float32
        (torch.randn(6, 4).t(), torch.ones(4, 1)),  # non-contiguous, per channel
        (torch.randn(2, 8, 3, 3).contiguous(memory_format=torch.channels_last),
         torch.ones(1, 8, 1, 1)),
        (torch.randn(4, 6, 5), torch.ones(4, 6, 1)),  # two channel axes
        (torch.randn(4, 6), torch.ones(1, 4, 6)),  # amax has more dims
        (torch.randn(4, 6), torch.ones(4, 3)),  # not broadcastable
        (torch.randn(8, 6)[::2], torch.tensor(1.0)),  # strided, not dense
    ],
)
def test_unsupported_inputs_fall_back(x, amax):
    assert _C.fake_quant_forward(x, amax, -127, 127) is None
    if x.shape == amax.shape[-x.dim():] or amax.numel() == 1 or amax.dim() <= x.dim():
        try:
            ref, _ = _fused.fake_quant_forward(x, amax.float(), -127, 127)
        except RuntimeError:  # the reference cannot broadcast it either
            return
        y, _ = _kernels.fake_quant_forward(x, amax.float(), -127, 127)
        torch.testing.assert_close(y, ref, **EXACT)
        grad = torch.randn_like(x)
        torch.testing.assert_close(
            _kernels.fake_quant_grad_input(grad, x, amax.float(), -127, 127),
            _fused.fake_quant_grad_input(grad, x, amax.float(), -127, 127), **EXACT)


@pytest.mark.parametrize("num_bits,unsigned,narrow", [(8, False, True), (8, True, False),
                                                     (4, False, False)])
@pytest.mark.parametrize("axis", [None, 0])
def test_bfloat16_ties_and_rounding_to_bfloat16(num_bits, unsigned, narrow, axis):
    """Values k + 0.5 steps (exactly so where bfloat16 holds them: |k + 0.5| <= 128) round
    half to even; results that are not bfloat16 values (steps of 0.3) are rounded to bfloat16
    once, as .to() does."""
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow)
    k = torch.arange(qmin - 3, qmax + 3, dtype=torch.float32)
    halves = torch.cat([k + 0.5, -(k + 0.5), k]) * 0.25
    x = torch.stack([halves, halves * 1.3]).bfloat16()
    amax = torch.tensor(qmax * 0.25) if axis is None else torch.tensor([[qmax * 0.25], [qmax * 0.3]])
    assert bool(((x[0].float() / _fused.scale_of(torch.tensor(qmax * 0.25), qmax)).frac().abs()
                 == 0.5).any())
    assert _check(x, amax, qmin, qmax)


def test_bfloat16_non_finite_inputs_and_gradients():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1e30, -1e-30, 0.3, 5.0, -5.0]).bfloat16()
    assert _check(x, torch.tensor(1.0), -127, 127) is True
    grad = torch.tensor([1.0, inf, -inf, nan, -2.0, nan, -inf, 3.0, -1.0, inf]).bfloat16()
    torch.testing.assert_close(_C.fake_quant_grad_input(grad, x, torch.tensor(1.0), -127, 127),
                               _fused.fake_quant_grad_input(grad, x, torch.tensor(1.0), -127, 127),
                               **EXACT)


def test_bfloat16_autograd_node_and_mixed_grad_dtype():
    x = (torch.randn(3, 4, 5) * 2).bfloat16().requires_grad_()
    amax = torch.tensor(1.0)
    y = _C.fake_quant_apply(x, amax, -127, 127, False)
    assert y.dtype == torch.bfloat16 and y.grad_fn.name() == "FakeQuantBackward"
    grad = torch.randn(3, 4, 5).bfloat16()
    y.backward(grad)
    torch.testing.assert_close(x.grad, _fused.fake_quant_grad_input(grad, x.detach(), amax, -127,
                                                                    127), **EXACT)
    assert _C.fake_quant_grad_input(grad.float(), x.detach(), amax, -127, 127) is None


def test_grad_with_other_layout_falls_back():
    x = torch.randn(4, 6)
    grad = torch.randn(6, 4).t()
    assert _C.fake_quant_grad_input(grad, x, torch.tensor(0.5), -127, 127) is None
    torch.testing.assert_close(
        _kernels.fake_quant_grad_input(grad, x, torch.tensor(0.5), -127, 127),
        _fused.fake_quant_grad_input(grad, x, torch.tensor(0.5), -127, 127), **EXACT)


@pytest.fixture
def restore_backend():
    before = _kernels.BACKEND
    yield
    _kernels.set_backend(before)


def _fq_grads(backend, x, amax, **fmt):
    _kernels.set_backend(backend)
    x = x.detach().clone().requires_grad_(True)
    y = fake_tensor_quant(x, amax, **fmt)
    weights = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    (y * weights).sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("num_bits,unsigned,narrow", [(8, False, True), (4, True, False), (16, False, False)])
@pytest.mark.parametrize("clip", [0.5, 2.0])  # some clipped / nothing clipped
def test_fake_tensor_quant_gradients_equal_between_backends(restore_backend, num_bits, unsigned,
                                                            narrow, clip):
    fmt = {"num_bits": num_bits, "unsigned": unsigned, "narrow_range": narrow}
    gen = torch.Generator().manual_seed(7)
    for x, amax in [
        (torch.randn(4, 8, 6, 6, generator=gen), None),
        (torch.randn(16, 4, 3, 3, generator=gen), (0,)),
        (torch.randn(3, 5, 10, generator=gen), (1,)),
    ]:
        if amax is None:
            a = x.abs().max() * clip
        else:
            dims = tuple(d for d in range(x.dim()) if d not in amax)
            a = x.abs().amax(dim=dims, keepdim=True) * clip
        y_cpp, g_cpp = _fq_grads("cpp", x, a, **fmt)
        y_ref, g_ref = _fq_grads("pytorch", x, a, **fmt)
        torch.testing.assert_close(y_cpp, y_ref, **EXACT)
        torch.testing.assert_close(g_cpp, g_ref, **EXACT)


def test_passthrough_backward_when_nothing_clipped(restore_backend):
    _kernels.set_backend("cpp")
    x = torch.linspace(-1, 1, 101, requires_grad=True)
    y = fake_tensor_quant(x, torch.tensor(1.0))
    assert y.grad_fn.passthrough is True
    g = torch.randn(101)
    y.backward(g)
    torch.testing.assert_close(x.grad, g, **EXACT)
    y2 = fake_tensor_quant(x, torch.tensor(0.5))
    assert y2.grad_fn.passthrough is False


def test_set_backend_rejects_unknown(restore_backend):
    with pytest.raises(ValueError):
        _kernels.set_backend("cuda-magic")
    assert _kernels.set_backend("pytorch") == "pytorch"
    y, clipped = _kernels.fake_quant_forward(torch.randn(5), torch.tensor(1.0), -127, 127)
    assert clipped is None
    assert _kernels.set_backend(None) == "cpp"


def test_tensor_subclasses_and_meta_fall_back():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, 5)
        amax = torch.tensor(1.0)
        assert _C.fake_quant_forward(x, amax, -127, 127) is None
        y, _ = _kernels.fake_quant_forward(x, amax, -127, 127)
        assert y.shape == x.shape
    assert _C.fake_quant_forward(torch.empty(4, 5, device="meta"), torch.tensor(1.0), -127,
                                 127) is None
    neg = torch.randn(4, 5)._neg_view()
    assert _C.fake_quant_forward(neg, torch.tensor(1.0), -127, 127) is None


def test_output_pool_reuses_only_unreferenced_buffers():
    x = torch.randn(300, 100)  # 120 kB: pooled
    amax = torch.tensor(1.0)
    ref, _ = _fused.fake_quant_forward(x, amax, -127, 127)
    y1, _ = _C.fake_quant_forward(x, amax, -127, 127)
    ptr = y1.data_ptr()
    y2, _ = _C.fake_quant_forward(x, amax, -127, 127)
    assert y2.data_ptr() != ptr  # y1 is alive
    view = y1[10:]
    del y1
    y3, _ = _C.fake_quant_forward(x * 2, amax, -127, 127)
    assert y3.data_ptr() != ptr  # a view still holds the storage
    torch.testing.assert_close(view, ref[10:], **EXACT)  # and it was not overwritten
    del view, y2, y3
    y4, _ = _C.fake_quant_forward(x, amax, -127, 127)
    torch.testing.assert_close(y4, ref, **EXACT)
    stats = _kernels.pool_stats()
    assert stats["buffers"] >= 1 and stats["held_bytes"] >= x.numel() * 4
    _kernels.empty_cache()
    assert _kernels.pool_stats()["held_bytes"] == 0
    torch.testing.assert_close(y4, ref, **EXACT)  # still valid after the pool let go


def test_output_pool_hands_a_buffer_between_dtypes_of_equal_bytes():
    """A float32 output's buffer, once free, may come back as a bfloat16 output of twice the
    elements (the pool keys on bytes): values and dtypes stay right both ways."""
    _kernels.empty_cache()
    amax = torch.tensor(1.0)
    x32 = torch.randn(200, 100)  # 80 kB
    x16 = (torch.randn(400, 100) * 2).bfloat16()  # the same bytes
    for _ in range(2):
        y32, _ = _C.fake_quant_forward(x32, amax, -127, 127)
        torch.testing.assert_close(y32, _fused.fake_quant_forward(x32, amax, -127, 127)[0], **EXACT)
        ptr = y32.data_ptr()
        del y32
        y16, _ = _C.fake_quant_forward(x16, amax, -127, 127)
        assert y16.data_ptr() == ptr  # the float32 output's buffer, handed over
        assert y16.dtype == torch.bfloat16 and y16.shape == x16.shape
        torch.testing.assert_close(y16, _fused.fake_quant_forward(x16, amax, -127, 127)[0], **EXACT)
        del y16
    _kernels.empty_cache()

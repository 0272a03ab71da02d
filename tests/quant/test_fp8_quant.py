"""FP8 E4M3 on the quantization side: calibration methods on the FP8 grid, the layer types
TensorRT cannot run in FP8, and QAT of an FP8 model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from train_steps import fit

import trtqat
from trtqat.errors import CalibrationMethodError, QuantConfigError
from trtqat.quant.calib.histogram import HistogramCalibrator
from trtqat.quant.calib.weights import calibrate_weights
from trtqat.quant.descriptor import E4M3
from trtqat.quant.fp8 import fake_e4m3
from trtqat.quant.model_ops import quantizers
from trtqat.runs.qat_recipe import qat_recipe


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Compute-bound: one thread."""


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 4))


def _fp8_error(x: torch.Tensor, amax: torch.Tensor) -> float:
    return float((fake_e4m3(x, amax) - x).pow(2).sum())


def test_mse_scores_the_fp8_grid():
    """'mse' of an FP8 calibrator picks the range with the least E4M3 error, not int8's."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(50000), torch.randn(20) * 40])
    int8, fp8 = HistogramCalibrator(8), HistogramCalibrator(E4M3)
    for c in (int8, fp8):
        c.collect(x)
    a8, af = int8.compute_amax("mse"), fp8.compute_amax("mse")
    assert not torch.equal(a8, af)  # the int8 grid clips the outliers, E4M3's does not
    assert _fp8_error(x, af) < _fp8_error(x, a8)
    # and the best of the candidate edges on the FP8 grid (within bin-centre accuracy)
    edges = fp8.bin_edges[128::64]
    assert _fp8_error(x, af) <= min(_fp8_error(x, e) for e in edges) * 1.01


def test_quantizer_calibrator_follows_fp8():
    """A quantizer made FP8 after it was built (trtqat.quantize's format) calibrates mse on
    the FP8 grid, also through calibrate_weights."""
    model = trtqat.quantize(_cnn(), {"format": "fp8"})
    assert all(q.num_bits == E4M3 and q._calibrator._num_bits == E4M3
               for _, q in quantizers(model))
    calibrate_weights(model, "mse")
    w = model[0]._weight_quantizer
    assert w.amax.shape[0] == 8 and bool(torch.isfinite(w.amax).all())


def test_fp8_calibrates_with_max_percentile_mse_and_refuses_entropy():
    batches = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    for method in ("max", "percentile", "mse"):
        model = trtqat.quantize(_cnn(), {"format": "fp8", "method": method},
                                forward_loop=batches)
        amax = [q.amax for _, q in quantizers(model) if not q.disabled]  # not the pool's
        assert all(a is not None and bool(torch.isfinite(a).all()) for a in amax), method
    with pytest.raises(QuantConfigError, match="no FP8 form.*max, percentile or mse") as exc:
        trtqat.quantize(_cnn(), {"format": "fp8", "method": "entropy"})
    assert "\n" not in str(exc.value)
    model = trtqat.quantize(_cnn(), {"format": "fp8"}, forward_loop=batches)
    with pytest.raises(CalibrationMethodError, match="no FP8 form"):
        trtqat.compute_amax(model, "entropy")  # collected, then asked for entropy


def test_layers_tensorrt_cannot_run_in_fp8_are_refused_with_the_fix():
    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                             nn.ConvTranspose2d(8, 4, 2, stride=2))

    with pytest.raises(QuantConfigError) as exc:
        trtqat.quantize(net(), {"format": "fp8"})
    msg = str(exc.value)
    assert "\n" not in msg and "2 (ConvTranspose2d" in msg
    assert "skip_layers=['2']" in msg and "--skip-layers 2" in msg and "int8" in msg
    trtqat.quantize(net(), {"format": "fp8", "skip_layers": ["2"]})  # the fix works
    trtqat.quantize(net(), {"format": "fp8", "keep_float": ["2"]})
    trtqat.quantize(net(), {"format": "int8"})  # INT8 deconvolution is TensorRT's
    with pytest.raises(QuantConfigError, match="3-D convolution"):
        trtqat.quantize(nn.Sequential(nn.Conv3d(2, 4, 3)), {"format": "fp8"})


def test_fp8_qat_lowers_the_loss_and_keeps_amax_finite():
    torch.manual_seed(0)
    images = torch.randn(32, 3, 8, 8)
    labels = (images.mean((1, 2, 3)) > 0).long() + 2 * (images[:, 0].mean((1, 2)) > 0).long()
    model = trtqat.quantize(_cnn(), {"format": "fp8"}, forward_loop=[images[:16]])
    recipe = qat_recipe(10, 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=recipe.lr * 20, momentum=0.9)
    losses = fit(lambda: nn.functional.cross_entropy(model(images), labels), opt, 12)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] * 0.9, losses
    assert model[0].weight.grad is not None and bool(model[0].weight.grad.abs().sum() > 0)
    assert all(bool(torch.isfinite(q.amax).all()) for _, q in quantizers(model)
               if not q.disabled)


def test_learned_fp8_range_gets_a_gradient():
    """init_learn_amax on an FP8 quantizer: the forward is fake_e4m3's, amax gets an
    LSQ-style gradient (clipping pushes it up) and a few steps lower the error."""
    torch.manual_seed(0)
    x = torch.randn(4096) * 3
    model = trtqat.quantize(nn.Sequential(nn.Linear(4, 4)), {"format": "fp8"})
    q = model[0]._input_quantizer
    q.amax = torch.tensor(0.5)
    q.init_learn_amax()
    fixed = fake_e4m3(x, torch.tensor(0.5))
    out = q(x)
    assert torch.equal(out.detach(), fixed)
    loss = (out - x).pow(2).mean()
    loss.backward()
    assert float(q._amax.grad) < 0  # most of x is clipped: a larger range lowers the error
    opt = torch.optim.Adam([q._amax], lr=0.2)
    first = loss.item()
    for _ in range(20):
        opt.zero_grad()
        loss = (q(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
    assert loss.item() < first * 0.5 and math.isfinite(float(q.amax))


def test_fp8_slow_convolutions_get_a_note(caplog):
    """Depthwise and large-kernel convolutions build in FP8 through fallback kernels: one
    NOTE line names them, nothing is refused; plain 3x3 convolutions get no note."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 7), nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 8, 3))
    with caplog.at_level("WARNING", logger="trtqat"):
        trtqat.quantize(net, {"format": "fp8"})
    notes = [r.getMessage() for r in caplog.records if "NOTE fp8" in r.getMessage()]
    assert len(notes) == 1 and "2 grouped" in notes[0] and "e.g. 0, 1" in notes[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="trtqat"):
        trtqat.quantize(_cnn(), {"format": "fp8"})
    assert not [r for r in caplog.records if "fallback kernels" in r.getMessage()]

"""Calibration methods and calibrators come from one registry: a new method is one function
and one registration, and every method list (AMAX_METHODS, --method) is derived from it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import trtqat
from trtqat.errors import CalibrationError, CalibrationMethodError, QuantConfigError
from trtqat.quant import model_ops
from trtqat.quant.calib import HistogramCalibrator, MaxCalibrator, calibrate_weights, registry
from trtqat.quant.calib.base import Calibrator
from trtqat.quant.calib.registry import AmaxMethod, get_method, methods
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.tensor_quantizer import TensorQuantizer


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    monkeypatch.setattr(registry, "_CALIBRATORS", dict(registry._CALIBRATORS))


def _median_bins(hist: torch.Tensor, *, num_bits: int, unsigned: bool,
                 share: float) -> torch.Tensor:
    cum = hist.cumsum(1)
    return torch.searchsorted(cum, cum[:, -1:] * share).reshape(-1) + 1


def test_the_built_in_methods_and_their_lists() -> None:
    assert methods() == tuple(m.value for m in AmaxMethod) == ("max", "percentile", "mse",
                                                                "entropy")
    assert model_ops.AMAX_METHODS == methods()
    assert registry.weight_methods() == ("max", "percentile", "mse")
    assert not get_method(AmaxMethod.MAX).needs_histogram
    assert get_method("entropy").needs_histogram and str(AmaxMethod.MSE) == "mse"
    with pytest.raises(CalibrationMethodError, match="unknown calibration method 'median': "
                       "use one of max, percentile, mse, entropy"):
        get_method("median")


def test_cli_method_choices_come_from_the_registry(capsys) -> None:
    from trtqat.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--method", "median"])
    err = capsys.readouterr().err
    assert "choose from max, percentile, mse, entropy" in err.replace("'", "")


def test_a_new_method_is_one_registration(isolated) -> None:
    registry.register_method("median", _median_bins, options={"share": 0.5})
    assert methods()[-1] == "median" and model_ops.AMAX_METHODS[-1] == "median"
    x = torch.arange(1, 1001, dtype=torch.float32)
    cal = HistogramCalibrator(num_bins=1000)
    cal.collect(x)
    assert float(cal.compute_amax("median")) == pytest.approx(500.0, abs=1.0)
    assert float(cal.compute_amax("median", share=0.25)) == pytest.approx(250.0, abs=1.0)
    with pytest.raises(CalibrationMethodError, match="unknown calibration option"):
        cal.compute_amax("median", shares=0.5)

    # model-wide: histogram quantizers take the method, max quantizers keep their maximum
    model = nn.Sequential(nn.Linear(4, 4))
    trtqat.quantize(model, trtqat.QuantConfig(
        quant_desc_input=QuantDescriptor(calib_method="histogram")))
    data = [torch.linspace(-8, 8, 64).reshape(16, 4)]
    trtqat.collect_stats(model, data, progress=False)
    trtqat.compute_amax(model, "median")
    layer = model[0]
    assert 3.0 < float(layer._input_quantizer.amax) < 5.0  # median of |x| in [0, 8]
    assert torch.equal(layer._weight_quantizer.amax.reshape(-1),
                       layer.weight.detach().abs().amax(1))
    calibrate_weights(model, "median", perchannel=False)
    assert float(layer._weight_quantizer.amax) < float(layer.weight.detach().abs().max())


def test_options_are_checked_per_method() -> None:
    cal = HistogramCalibrator(num_bins=64)
    cal.collect(torch.randn(100))
    cal.compute_amax("mse", percentile=500.0, start_bin=8)  # percentile: not mse's option
    with pytest.raises(CalibrationError, match="percentile=500"):
        cal.compute_amax("percentile", percentile=500.0)
    with pytest.raises(CalibrationError, match="needs num_bins >= 128"):
        cal.compute_amax("entropy", start_bin=1)
    with pytest.raises(QuantConfigError, match="needs a histogram search function"):
        registry.register_method("nothing", None)


class _ConstantCalibrator(Calibrator):
    def collect(self, x: torch.Tensor) -> None:
        self.seen = True

    def compute_amax(self) -> torch.Tensor:
        return torch.tensor(3.0)

    def reset(self) -> None:
        pass


def test_a_new_calibrator_is_one_class_and_one_registration(isolated) -> None:
    registry.register_calibrator("constant", _ConstantCalibrator)
    assert registry.calibrator_kinds() == ("max", "histogram", "constant")
    q = TensorQuantizer(QuantDescriptor(calib_method="constant"))
    assert isinstance(q._calibrator, _ConstantCalibrator)
    model = nn.Sequential(nn.ReLU())
    model.q = q
    model.q.enable_calib()
    model.q.disable_quant()
    model.q(torch.ones(2))
    trtqat.compute_amax(model, "entropy")  # the calibrator takes no method: its own range
    assert float(q.amax) == 3.0
    assert isinstance(registry.make_calibrator("max"), MaxCalibrator)
    with pytest.raises(QuantConfigError, match="calib_method='bogus' is unknown: use 'max' or "
                       "'histogram' or 'constant'"):
        QuantDescriptor(calib_method="bogus")


def test_the_registry_and_the_cli_parser_import_without_torch() -> None:
    code = ("import sys\n"
            "from trtqat.quant.calib.registry import methods\n"
            "from trtqat.cli import build_parser\n"
            "build_parser()\n"
            "assert methods()[0] == 'max'\n"
            "assert 'torch' not in sys.modules\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"

"""calibrate_weights: weight ranges straight from the weights, without running the model."""

from __future__ import annotations

import torch
from torch import nn

from trtqat.errors import CalibrationMethodError
from trtqat.quant.calib.histogram import HistogramCalibrator
from trtqat.quant.calib.registry import weight_methods


def _weight_axis(module: nn.Module, perchannel: bool) -> int | None:
    from trtqat.quant.modules import (
        QuantConvTranspose1d,
        QuantConvTranspose2d,
        QuantConvTranspose3d,
    )

    if not perchannel:
        return None
    transposed = (QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d)
    return 1 if isinstance(module, transposed) else 0


def calibrate_weights(model: nn.Module, method: str = "percentile", perchannel: bool = True,
                      percentile: float = 99.99, num_bins: int = 2048) -> None:
    """Set the amax of every weight quantizer from its weight.

    ``method`` ('max', 'percentile', 'mse' or another registered weight method) is used for every layer, whatever calibrator
    the quantizer carries. Per channel (``perchannel``) along the output channels: axis 0,
    axis 1 for ConvTranspose. The amax has the keep-dim shape of the weight along that axis
    (0-d per tensor) and replaces any amax of another shape.

    Raises:
        TypeError: an unknown ``method``.
    """
    if method not in weight_methods():
        raise CalibrationMethodError(f"Unsupported calibration method {method!r}: use one of "
                                     f"{', '.join(weight_methods())}")
    for _, module in model.named_modules():
        quantizer = getattr(module, "_weight_quantizer", None)
        weight = getattr(module, "weight", None)
        if quantizer is None or not isinstance(weight, torch.Tensor):
            continue
        axis = _weight_axis(module, perchannel)
        # the quantizer's own num_bits: an FP8 (4, 3) one's mse scores E4M3's grid
        calib = HistogramCalibrator(quantizer.num_bits, axis, quantizer.unsigned,
                                    num_bins=num_bins)
        calib.collect(weight.detach())
        amax = calib.compute_amax(method, percentile=percentile)
        quantizer._store_amax(quantizer._checked_amax(amax))

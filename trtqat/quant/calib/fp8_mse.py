"""'mse' for FP8 E4M3 quantizers: the range whose FP8 fake quantization has the least error.

The integer search (:func:`trtqat.quant.calib.thresholds.mse_bins`) rounds onto a uniform grid
of ``2**(bits-1) - 1`` steps; an E4M3 quantizer rounds onto a float grid (3 mantissa bits,
saturating at 448), so its error is measured with the quantizer's own arithmetic,
:func:`trtqat.quant.fp8.quantize_e4m3` (``x / (amax / 448)`` cast to float8_e4m3fn). The
candidates and the histogram are those of the integer search: bin edges
``start_bin, start_bin + stride, ... <= num_bins``, each bin's count placed at its centre.

TensorRT's entropy (KL divergence) calibration merges bins into ``2**(bits-1)`` *uniform*
levels; a float grid has no such levels, so it has no FP8 form and ``entropy`` is refused
for FP8 quantizers (:func:`refuse_entropy`).
"""

from __future__ import annotations

import torch

from trtqat.errors import CalibrationMethodError
from trtqat.quant.descriptor import E4M3
from trtqat.quant.fp8 import E4M3_MAX, quantize_e4m3

# elements per temporary (candidates x bins) tensor
_CHUNK_ELEMENTS = 1 << 22
ENTROPY_FP8 = ("entropy calibration (TensorRT's INT8 KL divergence over uniform levels) has "
               "no FP8 form: use method max, percentile or mse for format fp8")


def is_fp8(num_bits) -> bool:
    """``num_bits`` is FP8 E4M3's ``(4, 3)`` (a calibrator's or a quantizer's)."""
    return isinstance(num_bits, tuple) and tuple(num_bits) == E4M3


def refuse_entropy(num_bits) -> None:
    """A one-line CalibrationMethodError for entropy calibration of an FP8 quantizer."""
    if is_fp8(num_bits):
        raise CalibrationMethodError(ENTROPY_FP8)


def fp8_mse_bins(hist: torch.Tensor, start_bin: int, stride: int) -> torch.Tensor:
    """Per row of ``hist`` (``(C, N)`` counts over ``[0, range]``), the candidate edge whose
    E4M3 fake quantization of the bin centres has the least count-weighted squared error.

    Computed in units of one bin width (the argmin does not depend on it). Ties: first.
    """
    num_bins = hist.shape[1]
    cand = torch.arange(start_bin, num_bins + 1, stride, device=hist.device)
    centers = torch.arange(num_bins, device=hist.device, dtype=torch.float32) + 0.5
    per_chunk = max(1, _CHUNK_ELEMENTS // num_bins)
    errs = []
    for c0 in range(0, cand.numel(), per_chunk):
        amax = cand[c0:c0 + per_chunk].to(torch.float32).unsqueeze(1)  # (k, 1), in bins
        scale = amax / E4M3_MAX
        fake = quantize_e4m3(centers, scale).float() * scale  # (k, N)
        err = (fake.double() - centers.double()).square_()
        errs.append(hist @ err.T)  # (C, k)
    return cand[torch.cat(errs, 1).argmin(1)]

"""Block amax of INT4 weights: ``max`` (each block's largest ``|w|``) or ``mse`` (the
fraction of it that gives the least fake-quantization error, searched per block).

A block is ``block_size`` consecutive input channels of one output row of a 2-D weight;
amax has the shape ``(out, in / block_size)``.
"""

from __future__ import annotations

import torch

from trtqat.errors import CalibrationMethodError, QuantConfigError
from trtqat.formats import BLOCK_SIZES
from trtqat.quant._fused import scale_of
from trtqat.quant.calib.base import Calibrator

BLOCK_METHODS = ("max", "mse")
# mse candidates: these fractions of each block's maximum (1.0 first: it wins ties)
MSE_FRACTIONS = tuple(1.0 - 0.025 * i for i in range(21))  # 1.0 down to 0.5
_QMAX = 7


def block_fix(n: int) -> str:
    """What to do when the block size does not divide ``n`` channels (for error lines)."""
    fits = [str(b) for b in BLOCK_SIZES if n % b == 0]
    if fits:
        return f"use block_size {' or '.join(fits)}, or leave the layer float (skip_layers)"
    return (f"no block size of {', '.join(map(str, BLOCK_SIZES))} divides it: leave the "
            "layer float (skip_layers)")


def blocks_of(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """``w`` (``(out, in)``) viewed as ``(out, in / block_size, block_size)``; a block size
    that does not divide ``in`` is a one-line :class:`QuantConfigError`."""
    out, n = int(w.shape[0]), int(w.shape[1])
    if n % block_size:
        raise QuantConfigError(f"block_size {block_size} does not divide the weight's "
                               f"in_features {n}: {block_fix(n)}")
    return w.reshape(out, n // block_size, block_size)


def _error(blocks: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    scale = scale_of(amax, _QMAX).unsqueeze(-1)
    fq = (blocks / scale).round().clamp(-_QMAX, _QMAX) * scale
    return (fq - blocks).square().sum(-1)


@torch.no_grad()
def block_amax(w: torch.Tensor, block_size: int, method: str = "max") -> torch.Tensor:
    """The float32 block amax of weight ``w`` by ``method`` (max or mse)."""
    if method not in BLOCK_METHODS:
        raise CalibrationMethodError(
            f"INT4 block weights take amax method max or mse, not {method!r} (a histogram "
            "method for activations): use --method max or mse")
    blocks = blocks_of(w.detach().float(), block_size)
    peak = blocks.abs().amax(-1)
    if method == "max":
        return peak
    best, best_err = peak.clone(), _error(blocks, peak)
    for frac in MSE_FRACTIONS[1:]:
        cand = peak * frac
        err = _error(blocks, cand)
        better = err < best_err
        best = torch.where(better, cand, best)
        best_err = torch.where(better, err, best_err)
    return best


class BlockCalibrator(Calibrator):
    """Keeps the weight it saw and computes its block amax by method (max or mse)."""

    takes_method = True

    def __init__(self, block_size: int) -> None:
        super().__init__(4, None, False)
        self._block_size = block_size
        self._weight: torch.Tensor | None = None

    def collect(self, x: torch.Tensor) -> None:
        """Keep the weight (the same at every batch of a calibration)."""
        self._weight = x.detach()

    def compute_amax(self, method: str = "max", **options) -> torch.Tensor | None:
        """The block amax of the kept weight (None when none was seen)."""
        if self._weight is None:
            return None
        return block_amax(self._weight, self._block_size, str(method))

    def reset(self) -> None:
        """Forget the weight."""
        self._weight = None

"""Export mode: quantizers emit torch's fake-quantize ops, which ONNX exporters turn into
QuantizeLinear/DequantizeLinear with constant scales and zero-points."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from trtqat.errors import QuantizerStateError
from trtqat.quant._fused import scale_of

_state = threading.local()


def active() -> bool:
    """True inside :func:`enabled`."""
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """Within this block, TensorQuantizers use ONNX-exportable fake-quantize ops."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


# Integer ranges an ONNX QuantizeLinear can saturate to (int8 and uint8).
ONNX_RANGES = ((-128, 127), (0, 255))


def onnx_bounds(qmin: int, qmax: int) -> tuple[int, int]:
    """The (qmin, qmax) an exported fake-quant op uses for a quantizer's integer range.

    ONNX QuantizeLinear saturates int8 to [-128, 127]; a narrow-range signed 8-bit quantizer
    ([-127, 127], what TensorRT expects) keeps its scale ``amax / 127`` and exports as int8:
    only inputs beyond ``-amax`` could reach -128, one step past the calibrated range.
    """
    if (qmin, qmax) == (-127, 127):
        return -128, 127
    if (qmin, qmax) not in ONNX_RANGES:
        raise QuantizerStateError(
            f"a quantizer with integer range [{qmin}, {qmax}] cannot be exported: ONNX "
            "QuantizeLinear holds 8 bits; use num_bits=8 for TensorRT"
        )
    return qmin, qmax


def fake_quant_for_export(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int,
                          axis: tuple[int, ...] | None) -> torch.Tensor:
    """Fake-quantize with torch's ``fake_quantize_per_{tensor,channel}_affine`` ops."""
    scale = scale_of(amax, qmax)
    qmin, qmax = onnx_bounds(qmin, qmax)
    if scale.numel() == 1:
        zero_point = torch.zeros((), dtype=torch.int32, device=x.device)
        return torch.fake_quantize_per_tensor_affine(x, scale.reshape(()), zero_point, qmin, qmax)
    if axis is None or len(axis) != 1:
        raise QuantizerStateError(
            f"per-channel amax over axes {axis} cannot be exported: ONNX QuantizeLinear takes "
            "one axis; quantize per tensor or along one axis"
        )
    ch_axis = axis[0] % x.dim()
    scale = scale.reshape(-1)
    zero_point = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(x, scale, zero_point, ch_axis, qmin, qmax)

"""Export mode: quantizers emit torch's fake-quantize ops, which ONNX exporters turn into
QuantizeLinear/DequantizeLinear with constant scales and zero-points.

Four ways in: :func:`enabled` (trtqat's own export, which refuses uncalibrated activation
quantizers), and pytorch-quantization's idioms: ``quant_modules.enable_onnx_export()``,
``TensorQuantizer.use_fb_fake_quant = True`` and any ``torch.onnx.export``. With those an
uncalibrated quantizer warns and exports the range of the traced input, as
pytorch-quantization does (programs export before calibrating to find graph rules). Under the TorchScript exporter (``dynamo=False``) scales and
zero-points are traced as constants (a Python float per tensor), so opsets 10-12 export too.
FP8 E4M3 quantizers export only through :func:`enabled` (:func:`fp8_for_export`).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from trtqat.errors import QuantizerStateError
from trtqat.quant._fused import scale_of
from trtqat.quant.descriptor import axis_tuple
from trtqat.quant.fp8 import fp8_scale

DYNAMIC_RANGE_WARNING = (
    "trtqat: exporting a quantizer that has no amax (never calibrated): its scale is the range "
    "of the example input, as in pytorch-quantization. Fine for finding graph rules; calibrate "
    "before exporting a model to deploy (`trtqat export` refuses an uncalibrated one)")

_state = threading.local()
entered = 0  # open enabled() blocks in every thread: 0 spares the quantizers the thread-local


def active() -> bool:
    """True inside :func:`enabled`."""
    return entered > 0 and getattr(_state, "depth", 0) > 0


def strict() -> bool:
    """True inside ``enabled(strict=True)`` (trtqat's own export)."""
    return getattr(_state, "strict", 0) > 0


@contextlib.contextmanager
def enabled(strict: bool = True) -> Iterator[None]:
    """Within this block, TensorQuantizers use ONNX-exportable fake-quantize ops.

    ``strict`` (trtqat's export) refuses a quantizer without amax; otherwise (pytorch-
    quantization's ``enable_onnx_export``) it warns and exports the example's range."""
    global entered
    _state.depth = getattr(_state, "depth", 0) + 1
    _state.strict = getattr(_state, "strict", 0) + int(strict)
    entered += 1
    try:
        yield
    finally:
        entered -= 1
        _state.depth -= 1
        _state.strict -= int(strict)


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


def quantize_for_export(quantizer: Any, x: torch.Tensor, amax: torch.Tensor, qmin: int,
                        qmax: int) -> torch.Tensor:
    """A TensorQuantizer's forward while exporting (``amax``: the range it quantizes with)."""
    if quantizer._amax is None and "clip" not in quantizer._modules:
        if strict():
            raise QuantizerStateError(
                f"{quantizer._label()}: has no amax (it was never calibrated), so it would "
                "bake one batch's range into the ONNX file; calibrate or load amax first")
        warnings.warn(DYNAMIC_RANGE_WARNING, UserWarning, stacklevel=2)
    try:
        return fake_quant_for_export(x, amax.detach(), qmin, qmax, axis_tuple(quantizer._axis))
    except QuantizerStateError as exc:
        raise quantizer._named(exc) from None


def fake_quant_for_export(x: torch.Tensor, amax: torch.Tensor, qmin: int, qmax: int,
                          axis: tuple[int, ...] | None) -> torch.Tensor:
    """Fake-quantize with torch's ``fake_quantize_per_{tensor,channel}_affine`` ops."""
    return _fake_quant_ops(x, scale_of(amax, qmax), *onnx_bounds(qmin, qmax), axis)


def _fake_quant_ops(x: torch.Tensor, scale: torch.Tensor, qmin: int, qmax: int,
                    axis: tuple[int, ...] | None) -> torch.Tensor:
    """torch's fake-quantize op of ``x`` with ``scale`` (one value: per tensor)."""
    if torch.jit.is_tracing():  # the TorchScript exporter: scales are constants of the trace
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            if scale.numel() == 1:  # a Python float, as pytorch-quantization passes
                return torch.fake_quantize_per_tensor_affine(x, float(scale), 0, qmin, qmax)
            scale, zero_point, ch_axis = _per_channel(x, scale, axis)
            return torch.fake_quantize_per_channel_affine(x, scale.data, zero_point.data,
                                                          ch_axis, qmin, qmax)
    if scale.numel() == 1:
        zero_point = torch.zeros((), dtype=torch.int32, device=x.device)
        return torch.fake_quantize_per_tensor_affine(x, scale.reshape(()), zero_point, qmin, qmax)
    scale, zero_point, ch_axis = _per_channel(x, scale, axis)
    return torch.fake_quantize_per_channel_affine(x, scale, zero_point, ch_axis, qmin, qmax)


def _per_channel(x: torch.Tensor, scale: torch.Tensor, axis: tuple[int, ...] | None
                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(scale, zero_point, channel axis)`` of a per-channel fake quantization."""
    if axis is None or len(axis) != 1:
        raise QuantizerStateError(
            f"per-channel amax over axes {axis} cannot be exported: ONNX QuantizeLinear takes "
            "one axis; quantize per tensor or along one axis"
        )
    scale = scale.reshape(-1)
    return scale, torch.zeros_like(scale, dtype=torch.int32), axis[0] % x.dim()


def fp8_for_export(quantizer: Any, x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """An FP8 E4M3 TensorQuantizer's forward while exporting (trtqat's own export only).

    Emits torch's int8 fake-quantize op with the FP8 scale (:func:`trtqat.quant.fp8.
    fp8_scale`, the exact float32 the PyTorch model divides by) as a placeholder: the
    exporter's post-pass (:mod:`trtqat.export.fp8_qdq`) gives every Q/DQ of the traced graph
    an FLOAT8E4M3FN zero point. A plain ``torch.onnx.export`` has no such pass and would
    write INT8 Q/DQ, so it is refused.
    """
    if not (active() and strict()):
        raise QuantizerStateError(
            f"{quantizer._label()}: an FP8 quantizer exports only through trtqat "
            "(trtqat.export_onnx or `trtqat export --variant fp8`); a plain "
            "torch.onnx.export would write INT8 Q/DQ")
    if quantizer._amax is None and "clip" not in quantizer._modules:
        raise QuantizerStateError(
            f"{quantizer._label()}: has no amax (it was never calibrated), so it would "
            "bake one batch's range into the ONNX file; calibrate or load amax first")
    try:
        return _fake_quant_ops(x, fp8_scale(amax.detach()), -128, 127,
                               axis_tuple(quantizer._axis))
    except QuantizerStateError as exc:
        raise quantizer._named(exc) from None

"""TensorQuantizer: the fake-quant node every Quant* module carries."""

from __future__ import annotations

import torch
from torch import nn

from trtqat.errors import CalibrationError, QuantizerStateError
from trtqat.quant import export_mode
from trtqat.quant.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from trtqat.quant.functional import (
    _FakeQuant,
    _FakeQuantLearnable,
    quant_bounds,
    tensor_quant,
)


def _make_calibrator(desc: QuantDescriptor):
    from trtqat.quant.calib import HistogramCalibrator, MaxCalibrator

    if desc.calib_method == "histogram":
        return HistogramCalibrator(desc.num_bits, desc.axis, desc.unsigned)
    return MaxCalibrator(desc.num_bits, desc.axis, desc.unsigned)


class TensorQuantizer(nn.Module):
    """Fake-quantizes (or calibrates on) the tensor that flows through it.

    Same switches as pytorch-quantization: ``enable/disable`` (bypass entirely),
    ``enable_quant/disable_quant``, ``enable_calib/disable_calib``; ``load_calib_amax``
    turns collected statistics into ``amax``.
    """

    def __init__(self, quant_desc: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR,
                 disabled: bool = False, if_quant: bool = True, if_clip: bool = False,
                 if_calib: bool = False) -> None:
        super().__init__()
        if not isinstance(quant_desc, QuantDescriptor):
            raise TypeError(f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}")
        self._desc = quant_desc
        self._num_bits = quant_desc.num_bits
        self._axis = quant_desc.axis
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range
        self._fake_quant = quant_desc.fake_quant
        self._learn_amax = quant_desc.learn_amax
        self._scale_amax = quant_desc.scale_amax
        self._qmin, self._qmax = quant_bounds(self._num_bits, self._unsigned, self._narrow_range)
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = if_clip
        self._if_calib = if_calib
        self._name = ""
        self._calibrator = _make_calibrator(quant_desc)
        if self._learn_amax:
            init = 1.0 if quant_desc.amax is None else quant_desc.amax
            self._amax = nn.Parameter(torch.tensor(init, dtype=torch.float32))
        elif quant_desc.amax is not None:
            self.register_buffer("_amax", self._checked_amax(quant_desc.amax))
        else:
            self.register_buffer("_amax", None)

    # ----------------------------------------------------------------- properties
    @property
    def num_bits(self) -> int:
        return self._num_bits

    @property
    def axis(self) -> tuple[int, ...] | None:
        return self._axis

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @property
    def fake_quant(self) -> bool:
        return self._fake_quant

    @property
    def learn_amax(self) -> bool:
        return self._learn_amax

    @property
    def disabled(self) -> bool:
        return self._disabled

    @property
    def maxbound(self) -> int:
        """Largest integer of the range (127 for signed 8-bit)."""
        return self._qmax

    @property
    def minbound(self) -> int:
        return self._qmin

    @property
    def amax(self) -> torch.Tensor | None:
        """The calibrated range (None before calibration)."""
        return None if self._amax is None else self._amax.detach()

    @amax.setter
    def amax(self, value) -> None:
        value = self._checked_amax(value)
        if isinstance(self._amax, nn.Parameter):
            with torch.no_grad():
                if self._amax.shape != value.shape:
                    self._amax = nn.Parameter(value.to(self._amax.device))
                else:
                    self._amax.copy_(value)
        elif self._amax is None:
            self.register_buffer("_amax", value)
        else:
            self._amax = value.to(self._amax.device)

    @property
    def step_size(self) -> torch.Tensor | None:
        """Quantization step ``amax / maxbound``."""
        return None if self._amax is None else self.amax / self._qmax

    # ----------------------------------------------------------------- switches
    def enable(self) -> None:
        self._disabled = False

    def disable(self) -> None:
        self._disabled = True

    def enable_quant(self) -> None:
        self._if_quant = True

    def disable_quant(self) -> None:
        self._if_quant = False

    def enable_calib(self) -> None:
        if self._calibrator is None:
            raise QuantizerStateError(f"{self._label()}: has no calibrator to enable")
        self._if_calib = True

    def disable_calib(self) -> None:
        self._if_calib = False

    def enable_clip(self) -> None:
        raise QuantizerStateError(
            f"{self._label()}: learned clipping is not supported; use "
            "QuantDescriptor(learn_amax=True) to learn the range instead"
        )

    def disable_clip(self) -> None:
        self._if_clip = False

    # ----------------------------------------------------------------- calibration
    def load_calib_amax(self, method: str | None = None, strict: bool = True, **kwargs) -> None:
        """Set ``amax`` from the calibrator (``method``: percentile, mse, entropy, max).

        ``strict`` refuses ranges that are all zero; NaN, infinite and negative ranges are
        always refused.
        """
        if self._calibrator is None:
            raise QuantizerStateError(f"{self._label()}: has no calibrator")
        if method is None:
            amax = self._calibrator.compute_amax(**kwargs) if kwargs else self._calibrator.compute_amax()
        else:
            amax = self._calibrator.compute_amax(method, **kwargs)
        if amax is None:
            raise CalibrationError(
                f"{self._label()}: calibrator collected no data; run batches through the "
                "model with calibration enabled (collect_stats) before computing amax"
            )
        amax = amax.detach().float()
        if self._scale_amax is not None:
            amax = amax * self._scale_amax
        if not strict and bool((amax == 0).all()):
            amax = torch.ones_like(amax)
        self.amax = amax

    def init_learn_amax(self) -> None:
        """Make ``amax`` a trainable parameter, starting from its calibrated value."""
        if self._amax is None:
            raise QuantizerStateError(f"{self._label()}: calibrate before learning amax")
        self._learn_amax = True
        value = self._amax.detach().clone()
        del self._amax
        self._amax = nn.Parameter(value)

    # ----------------------------------------------------------------- forward
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._disabled:
            return inputs
        if self._if_calib:
            self._calibrator.collect(inputs)
        if not self._if_quant:
            return inputs
        amax = self._amax
        if amax is None:
            raise QuantizerStateError(
                f"{self._label()}: amax is not set; calibrate the model (collect_stats + "
                "compute_amax) or load a calibrated checkpoint before quantizing"
            )
        if not self._fake_quant:
            return tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range)[0]
        if export_mode.active():
            return export_mode.fake_quant_for_export(inputs, amax.detach(), self._qmin, self._qmax, self._axis)
        if self._learn_amax:
            return _FakeQuantLearnable.apply(inputs, amax.abs().clamp_min(1e-8), self._qmin, self._qmax)
        return _FakeQuant.apply(inputs, amax, self._qmin, self._qmax)

    # ----------------------------------------------------------------- helpers
    def _label(self) -> str:
        return f"quantizer '{self._name}'" if self._name else "TensorQuantizer"

    def _checked_amax(self, value) -> torch.Tensor:
        amax = value.detach().float().clone() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
        if amax.numel() == 0:
            raise QuantizerStateError(f"{self._label()}: amax is empty")
        if not bool(torch.isfinite(amax).all()):
            raise QuantizerStateError(
                f"{self._label()}: amax contains NaN or inf; the calibration data or the "
                "weights hold non-finite values - check the inputs and recalibrate"
            )
        if bool((amax < 0).any()):
            raise QuantizerStateError(f"{self._label()}: amax is negative ({amax.min().item():g}); amax is a magnitude and must be > 0")
        if bool((amax == 0).all()):
            raise QuantizerStateError(
                f"{self._label()}: amax is 0, so nothing can be represented; calibrate on "
                "data that reaches this layer, or disable this quantizer"
            )
        if self._axis is None and amax.numel() == 1:
            amax = amax.reshape(())
        return amax

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        key = prefix + "_amax"
        if key in state_dict:
            value = state_dict[key]
            if self._amax is not None and self._amax.shape != value.shape and not (
                self._amax.numel() == 1 and value.numel() == 1
            ):
                raise QuantizerStateError(
                    f"quantizer '{prefix[:-1]}': checkpoint amax has shape "
                    f"{tuple(value.shape)} but the model's has {tuple(self._amax.shape)}; "
                    "the checkpoint was made with another model or quantization axis"
                )
            if self._axis is None and value.numel() == 1:
                value = value.reshape(())
                state_dict[key] = value
            if self._amax is None:
                self.register_buffer("_amax", torch.empty_like(value, dtype=torch.float32))
            elif self._amax.shape != value.shape:
                self._amax.data = self._amax.data.reshape(value.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        parts = [f"{self._num_bits}bit", "narrow" if self._narrow_range else "full",
                 "unsigned" if self._unsigned else "signed",
                 "fake" if self._fake_quant else "real",
                 "per-tensor" if self._axis is None else f"axis={self._axis}"]
        amax = self._amax
        if amax is None:
            parts.append("amax=None")
        elif amax.numel() == 1:
            parts.append(f"amax={float(amax):.4f}")
        else:
            parts.append(f"amax=[{float(amax.min()):.4f}, {float(amax.max()):.4f}]({amax.numel()})")
        if self._learn_amax:
            parts.append("learned")
        if self._calibrator is not None:
            parts.append(f"calibrator={type(self._calibrator).__name__}")
        if self._if_calib:
            parts.append("calib")
        if self._if_quant:
            parts.append("quant")
        return " ".join(parts)



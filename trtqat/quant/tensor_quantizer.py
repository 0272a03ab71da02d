"""TensorQuantizer: the fake-quant node every Quant* module carries."""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from trtqat.errors import (
    CalibrationError,
    QuantConfigError,
    QuantizerStateError,
    QuantTypeError,
    TrtqatError,
)
from trtqat.quant import _kernels, export_mode, fast_path, pq_ops
from trtqat.quant.amax import checked_amax, fits, shape_buffers_for, store_amax
from trtqat.quant.calib.base import follow_bits, reduce_dims
from trtqat.quant.clip import Clip
from trtqat.quant.describe import describe
from trtqat.quant.descriptor import E4M3, QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor, axis_tuple
from trtqat.quant.fp8_learn import fake_e4m3_any
from trtqat.quant.functional import _FakeQuant, _FakeQuantLearnable, onnx_exporting, quant_bounds
from trtqat.quant.module_names import quantizer_label

log = logging.getLogger(__name__)


def _make_calibrator(desc: QuantDescriptor):
    from trtqat.quant.calib.registry import make_calibrator

    return make_calibrator(desc.calib_method, desc.num_bits, desc.axis, desc.unsigned)


@functools.lru_cache(maxsize=64)
def _int_bounds(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[int, int]:
    return quant_bounds(num_bits, unsigned, narrow_range)


_int_bounds_plain = _int_bounds.__wrapped__  # traced by torch.compile


def _flag(attr: str, doc: str) -> property:
    """A settable bool property kept in ``attr``."""
    return property(lambda self: getattr(self, attr),
                    lambda self, value: setattr(self, attr, bool(value)), doc=doc)


def _exporting() -> bool:
    """Quantizers emit torch's fake-quantize ops (export mode, ``use_fb_fake_quant``, ONNX export)."""
    return ((export_mode.entered and export_mode.active()) or TensorQuantizer.use_fb_fake_quant
            or onnx_exporting())


class TensorQuantizer(nn.Module):
    """Fake-quantizes (or calibrates on) the tensor that flows through it.

    pytorch-quantization's API: ``enable/disable`` (bypass entirely), ``enable_quant`` /
    ``disable_quant``, ``enable_calib`` / ``disable_calib``, ``enable_clip`` / ``disable_clip``;
    ``load_calib_amax`` turns collected statistics into ``amax``. Without an amax the range
    of the current input is used (dynamic range); ``trtqat export`` refuses such a model.
    ``scale_amax`` multiplies every amax source; ``pre_quant_scale`` multiplies the input
    before calibration and quantization. ``num_bits=(4, 3)`` quantizes to FP8 E4M3.

    ``use_fb_fake_quant = True`` (class attribute) makes every quantizer emit torch's
    fake-quantize ops, so a plain ``torch.onnx.export`` writes QuantizeLinear/DequantizeLinear;
    so does any ``torch.onnx.export`` and :func:`trtqat.export.export_onnx`.
    """

    use_fb_fake_quant = False
    _hot = None  # fast_path.decide()'s tuple; None: decide at the next call
    _plain_forward = True  # False in a subclass that overrides a stage of the quantization
    __call__ = fast_path.quantizer_call  # the compiled kernel without nn.Module's dispatch

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_forward = all(getattr(cls, name) is getattr(TensorQuantizer, name)
                                 for name in ("_forward_stages", "_quant_forward", "_get_amax",
                                              "_bounds"))

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name != "_hot":  # any state change: the forward decides its path again
            self.__dict__["_hot"] = None

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        self.__dict__["_hot"] = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_hot": None}  # holds a kernel function: not picklable

    def __init__(self, quant_desc: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR,
                 disabled: bool = False, if_quant: bool = True, if_clip: bool = False,
                 if_calib: bool = False) -> None:
        super().__init__()
        if not isinstance(quant_desc, QuantDescriptor):
            raise QuantTypeError(f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}")
        self._num_bits = quant_desc.num_bits
        self._fake_quant = quant_desc.fake_quant
        self._axis = quant_desc.axis
        self._scale_amax = quant_desc.scale_amax
        self._learn_amax = quant_desc.learn_amax
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range
        self._scale = None if not quant_desc.fake_quant else 1.0
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = False
        self._if_calib = if_calib
        self._name = ""
        self._calibrator = _make_calibrator(quant_desc)
        amax = None if quant_desc.amax is None else torch.tensor(quant_desc.amax)
        self.register_buffer("_amax", amax)
        self.register_buffer("_pre_quant_scale", None)
        if self._learn_amax:
            init = 1.0 if quant_desc.amax is None else quant_desc.amax
            self.clip = Clip(-init, init, learn_min=True, learn_max=True)
            self.enable_clip()
        if if_clip:
            self.enable_clip()

    # ----------------------------------------------------------------- properties
    @property
    def num_bits(self) -> int | tuple[int, int]:
        """Integer bits, or (4, 3) for E4M3. Settable."""
        return self._num_bits

    @num_bits.setter
    def num_bits(self, value: int | tuple[int, int]) -> None:
        QuantDescriptor(num_bits=value)  # validates
        self._num_bits = follow_bits(self._calibrator, value)  # FP8: mse searches E4M3's grid

    unsigned = _flag("_unsigned", "Unsigned integer range. Settable.")
    narrow_range = _flag("_narrow_range", "[-127, 127] instead of [-128, 127]. Settable.")
    axis = property(lambda self: self._axis, doc="The axis kept per channel, as given.")
    fake_quant = property(lambda self: self._fake_quant, doc="Quantize-dequantize if True.")
    learn_amax = property(lambda self: self._learn_amax, doc="The range is trained.")
    disabled = property(lambda self: self._disabled, doc="Bypassed entirely.")

    scale = property(lambda self: self._scale, doc="Scale of the last real "
                     "(``fake_quant=False``) quantization; 1.0 in fake mode.")
    maxbound = property(lambda self: self._bounds()[1],
                        doc="Largest integer of the range (127 for signed 8-bit).")

    @property
    def minbound(self) -> int:
        """Smallest integer of the range (-128 for full-range signed 8-bit)."""
        return self._bounds()[0]

    @property
    def amax(self) -> torch.Tensor | None:
        """The stored range (None: each input's own range is used); detached when learned."""
        return self._amax.detach() if isinstance(self._amax, nn.Parameter) else self._amax

    @amax.setter
    def amax(self, value) -> None:
        if value is None:
            raise QuantTypeError(f"{self._label()}: amax cannot be set to None")
        value = self._checked_amax(value)
        if self._amax is not None and self._amax.shape != value.shape:
            raise QuantTypeError(
                f"{self._label()}: amax has shape {tuple(self._amax.shape)}; setting one of "
                f"shape {tuple(value.shape)} is not allowed (load a state dict to change it)")
        self._store_amax(value)

    @property
    def pre_quant_scale(self) -> torch.Tensor | None:
        """Factor applied to the input before calibration and quantization (None: none)."""
        return self._pre_quant_scale

    @pre_quant_scale.setter
    def pre_quant_scale(self, value) -> None:
        if value is None:
            self._pre_quant_scale = None
            return
        try:
            value = torch.as_tensor(value, dtype=torch.float32).detach().clone()
        except (TypeError, ValueError, RuntimeError) as err:
            raise QuantTypeError(f"{self._label()}: pre_quant_scale must be numeric, got {value!r}") from err
        self._pre_quant_scale = value

    @property
    def step_size(self) -> torch.Tensor | None:
        """Quantization step ``amax / maxbound`` (None with a dynamic range)."""
        return None if self._amax is None else self._amax / self.maxbound

    # ----------------------------------------------------------------- switches
    def enable(self) -> None:
        """Quantize (or calibrate) again."""
        self._disabled = False

    def disable(self) -> None:
        """Bypass the quantizer entirely."""
        self._disabled = True

    def enable_quant(self) -> None:
        """Run the quantization stage."""
        self._if_quant = True

    def disable_quant(self) -> None:
        """Skip the quantization stage (calibration may still run)."""
        self._if_quant = False

    def enable_calib(self) -> None:
        """Collect statistics of every input."""
        if self._calibrator is None:
            raise QuantConfigError(f"{self._label()}: has no calibrator to enable")
        self._if_calib = True

    def disable_calib(self) -> None:
        """Stop collecting statistics."""
        self._if_calib = False

    def enable_clip(self) -> None:
        """Clip the input with the learnable :class:`Clip` stage (needs ``learn_amax``)."""
        if not self._learn_amax or not hasattr(self, "clip"):
            raise QuantConfigError(f"{self._label()}: learn_amax is False, cannot enable clip; "
                                   "use QuantDescriptor(learn_amax=True)")
        self.clip.clip_value_min.requires_grad_(True)
        self.clip.clip_value_max.requires_grad_(True)
        self._if_clip = True

    def disable_clip(self) -> None:
        """Stop clipping and freeze the clip bounds."""
        self._if_clip = False
        if hasattr(self, "clip"):
            self.clip.clip_value_min.requires_grad_(False)
            self.clip.clip_value_max.requires_grad_(False)

    # ----------------------------------------------------------------- calibration
    def load_calib_amax(self, *args, strict: bool = True, **kwargs) -> None:
        """Set ``amax`` from the calibrator (``method``: percentile, mse, entropy, max).

        ``strict`` refuses ranges that are all zero; NaN, infinite and negative ranges are
        always refused. A calibrator that collected no data raises RuntimeError when
        ``strict``; with ``strict=False`` (as pytorch-quantization programs pass for
        quantizers that never ran, e.g. disabled ones) it warns and leaves amax unset, where
        pytorch-quantization stores NaN: the quantizer stays uncalibrated, so export refuses it.
        """
        if self._calibrator is None:
            raise QuantizerStateError(f"{self._label()}: has no calibrator")
        try:
            amax = self._calibrator.compute_amax(*args, **kwargs)
        except TrtqatError as exc:
            raise self._named(exc) from None
        if amax is None and not strict:
            log.warning("%s: calibrator collected no data; amax left unset (strict=False)",
                        self._label())
            return
        if amax is None:
            raise CalibrationError(
                f"{self._label()}: Calibrator returned None: it collected no data; run batches "
                "through the model with calibration enabled (collect_stats) before computing amax")
        amax = amax.detach().float()
        if not strict and bool((amax == 0).all()):
            amax = torch.ones_like(amax)
        self._store_amax(self._checked_amax(amax))

    def init_learn_amax(self) -> None:
        """Start learning the range from the stored amax.

        With ``learn_amax`` (a Clip stage) the clip bounds are set to ``-+amax``, as in
        pytorch-quantization. Otherwise (a trtqat extension) ``amax`` itself becomes a
        trainable parameter with an LSQ-style gradient.
        """
        if self._amax is None:
            raise QuantizerStateError(f"{self._label()}: calibrate before learning amax")
        if hasattr(self, "clip"):
            init = self._amax.detach().max()
            self.clip.clip_value_min.data.copy_(-init)
            self.clip.clip_value_max.data.copy_(init)
            return
        self._learn_amax = True
        value = self._amax.detach().clone()
        del self._amax
        self._amax = nn.Parameter(value)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Scale by ``pre_quant_scale``, collect statistics, clip, quantize: each if enabled."""
        if self._disabled:
            return inputs
        # QAT's common case (a stored int range, fake quantization, nothing else) as decided
        # once per state (fast_path); plain dict reads (nn.Module.__getattr__ costs more)
        amax = self._buffers.get("_amax")
        if fast_path.is_compiling():  # traced: decided in the graph, nothing read or kept
            hot = fast_path.decide(self, amax, _int_bounds_plain)
        elif ((hot := self._hot) is None or hot[0] is not amax or hot[2] != _kernels.EPOCH
                or (hot[1] >= 0 and amax._version != hot[1])):
            hot = self.__dict__["_hot"] = fast_path.decide(self, amax, _int_bounds)
        if (not hot[7] or (export_mode.entered and export_mode.active())
                or TensorQuantizer.use_fb_fake_quant or onnx_exporting()):  # _exporting()
            return self._forward_stages(inputs)
        if hot[3] is not None:
            outputs = hot[3](inputs, amax, hot[4], hot[5], hot[6])
            if outputs is not None:
                return outputs
        if amax.numel() == 1 or fast_path.fits(amax.shape, inputs.shape):
            if hot[6] and bool(inputs.min() < 0):
                self._refuse_negative(inputs, amax)
            return _FakeQuant.apply(inputs, amax.detach() if amax.requires_grad else amax,
                                    hot[4], hot[5])
        return self._forward_stages(inputs)
    _own_forward = forward  # quantizer_call's direct kernel call stands for this forward only

    def _forward_stages(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._pre_quant_scale is not None:
            inputs = inputs * self._pre_quant_scale.to(inputs.device)
        if self._if_calib:
            try:
                self._calibrator.collect(inputs)
            except TrtqatError as exc:  # the calibrator does not know whose data it got
                raise self._named(exc) from None
        outputs = inputs
        if self._if_clip:
            outputs = self.clip(inputs)
        if self._if_quant:
            outputs = self._quant_forward(inputs)
        return outputs

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if "clip" in self._modules:  # learn_amax: the range is the clip's, clip stage on or not
            inputs = self.clip(inputs)
            amax = torch.max(-self.clip.clip_value_min, self.clip.clip_value_max).detach()
        else:
            amax = self._get_amax(inputs)
        exporting = _exporting()
        if self._num_bits == E4M3:  # trtqat.quant.fp8: ONNX's Q/DQ arithmetic
            if exporting:
                return export_mode.fp8_for_export(self, inputs, amax)
            return fake_e4m3_any(inputs, amax)  # a learned amax gets a gradient
        if not self._fake_quant:
            outputs, self._scale = pq_ops.tensor_quant(inputs, amax, self._num_bits,
                                                       self._unsigned, self._narrow_range)
            return outputs
        qmin, qmax = self._bounds()
        if qmax < 1:  # num_bits 0 (or 1 signed): nothing but zero is representable
            return inputs * 0
        if exporting:
            return export_mode.quantize_for_export(self, inputs, amax, qmin, qmax)
        if "_amax" in self._parameters:  # a learned amax (init_learn_amax)
            return _FakeQuantLearnable.apply(inputs, amax.abs().clamp_min(1e-8), qmin, qmax)
        if self._unsigned and bool(inputs.min() < 0):
            self._refuse_negative(inputs, amax)
        return _FakeQuant.apply(inputs, amax.detach(), qmin, qmax)

    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """The stored amax, else the current input's (per the quantizer's axis); times scale_amax."""
        amax = self._amax
        if amax is not None:
            if amax.numel() != 1 and not fits(amax.shape, inputs.shape):
                raise QuantizerStateError(
                    f"{self._label()}: amax of shape {tuple(amax.shape)} does not fit an input "
                    f"of shape {tuple(inputs.shape)}; load the amax of this layer")
        else:
            dims = reduce_dims(inputs, axis_tuple(self._axis))
            with torch.no_grad():
                amax = inputs.detach().abs().float()
                amax = amax.amax(dim=dims, keepdim=True) if dims else amax  # dims=() reduces all
            if self._axis is None:
                amax = amax.reshape(())
        if self._scale_amax is not None:
            amax = amax * self._scale_amax
        return amax

    # ----------------------------------------------------------------- helpers
    def _bounds(self) -> tuple[int, int]:
        if self._num_bits == E4M3:
            return -448, 448
        return _int_bounds(self._num_bits, self._unsigned, self._narrow_range)

    def _label(self) -> str:
        return quantizer_label(self)

    def _named(self, exc: TrtqatError) -> TrtqatError:
        """``exc`` again, its message prefixed with this quantizer's name."""
        return type(exc)(f"{self._label()}: {exc}")

    def _refuse_negative(self, inputs: torch.Tensor, amax: torch.Tensor) -> None:
        try:  # raises TypeError, as pytorch-quantization
            pq_ops._check(inputs, amax, True)
        except TrtqatError as exc:
            raise self._named(exc) from None

    def _store_amax(self, value: torch.Tensor) -> None:
        store_amax(self, value)

    def _checked_amax(self, value) -> torch.Tensor:
        return checked_amax(value, self._label)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        shape_buffers_for(self, state_dict, prefix)  # amax / pre_quant_scale of any shape
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return describe(self)

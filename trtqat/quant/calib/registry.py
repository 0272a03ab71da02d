"""Calibration methods and calibrators by name: a new one is one function or class plus one
registration.

Two registries:

* amax methods (``max``, ``percentile``, ``mse``, ``entropy``; :class:`AmaxMethod`): how a
  range is read from what a calibrator collected. A histogram method is a function
  ``fn(hist, *, num_bits, unsigned, **options) -> edge index per row`` (see
  :mod:`trtqat.quant.calib.thresholds`) registered with :func:`register_method`; the CLI's
  ``--method`` choices, ``AMAX_METHODS`` and every method check come from :func:`methods`.
* calibrators (the collector kinds of ``QuantDescriptor(calib_method=...)``: ``max``,
  ``histogram``): :func:`register_calibrator` and :func:`make_calibrator`.

    from trtqat.quant.calib import registry

    def median_bins(hist, *, num_bits, unsigned):
        cum = hist.cumsum(1)
        return torch.searchsorted(cum, cum[:, -1:] / 2).reshape(-1) + 1

    registry.register_method("median", median_bins)
    trtqat.compute_amax(model, "median")
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from trtqat.errors import CalibrationMethodError, QuantConfigError

if TYPE_CHECKING:
    import torch

# A function, or its "module:name" path (imported on first use: this module loads no torch).
Ref = Callable[..., Any] | str


def _resolve(ref: Ref | None) -> Callable[..., Any] | None:
    if isinstance(ref, str):
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)
    return ref


class AmaxMethod(str, Enum):
    """The built-in amax methods."""

    MAX = "max"
    PERCENTILE = "percentile"
    MSE = "mse"
    ENTROPY = "entropy"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class MethodSpec:
    """One amax method.

    Attributes:
        name: the method's name (``--method``, ``compute_amax(model, name)``).
        fn: ``fn(hist, *, num_bits, unsigned, **options)`` -> per row of ``hist`` (``(C, N)``
            float64 counts over ``[0, range]``) the edge index ``0..N`` of the range (or its
            ``"module:name"``); None for a method that needs no histogram ('max': the exact
            running maximum).
        options: the keyword options ``fn`` takes, with their defaults.
        check: ``check(num_bins, num_bits, unsigned, **options)`` raises a one-line
            CalibrationError for bad options (None: no check).
        weights: usable for weight ranges (:func:`~trtqat.quant.calib.calibrate_weights`).
        help: one line for listings.
    """

    name: str
    fn: Ref | None
    options: Mapping[str, Any] = field(default_factory=dict)
    check: Ref | None = None
    weights: bool = True
    help: str = ""

    @property
    def needs_histogram(self) -> bool:
        """The method reads a histogram (a max calibrator falls back to its maximum)."""
        return self.fn is not None

    def resolve(self, num_bins: int, num_bits: int, unsigned: bool,
                options: Mapping[str, Any]) -> dict[str, Any]:
        """This method's options (defaults filled in, checked); others' options are dropped,
        names no registered method knows are refused."""
        unknown = set(options) - option_names()
        if unknown:
            raise CalibrationMethodError(
                f"unknown calibration option(s) {', '.join(sorted(unknown))}: "
                f"use {', '.join(sorted(option_names())) or 'none'}")
        own = {k: options.get(k, default) for k, default in self.options.items()}
        if self.check is not None:
            _resolve(self.check)(num_bins, num_bits, unsigned, **own)
        return own


_METHODS: dict[str, MethodSpec] = {}


def _key(name: str | AmaxMethod) -> str:
    return name.value if isinstance(name, AmaxMethod) else str(name)


def register_method(name: str | AmaxMethod, fn: Ref | None, *,
                    needs_histogram: bool = True, options: Mapping[str, Any] | None = None,
                    check: Ref | None = None, weights: bool = True,
                    help: str = "") -> MethodSpec:
    """Register (or replace) an amax method; ``needs_histogram=False`` takes no ``fn``."""
    if needs_histogram and fn is None:
        raise QuantConfigError(f"amax method {_key(name)!r} needs a histogram search function")
    spec = MethodSpec(_key(name), fn if needs_histogram else None, dict(options or {}), check,
                      weights, help)
    _METHODS[spec.name] = spec
    return spec


def methods() -> tuple[str, ...]:
    """Every registered amax method, in registration order ('max' first)."""
    return tuple(_METHODS)


def weight_methods() -> tuple[str, ...]:
    """The methods usable for weight ranges."""
    return tuple(name for name, spec in _METHODS.items() if spec.weights)


def option_names() -> set[str]:
    """Every option some registered method takes."""
    return {opt for spec in _METHODS.values() for opt in spec.options}


def get_method(name: str | AmaxMethod) -> MethodSpec:
    """The :class:`MethodSpec` of ``name``; an unknown name is a CalibrationMethodError."""
    spec = _METHODS.get(_key(name))
    if spec is None:
        raise CalibrationMethodError(f"unknown calibration method {_key(name)!r}: use one of "
                                     f"{', '.join(_METHODS)}")
    return spec


def amax_from_histogram(hist: torch.Tensor, hist_range: torch.Tensor, method: str, *,
                        num_bits: int = 8, unsigned: bool = False,
                        **options: Any) -> torch.Tensor:
    """amax from histograms ``hist`` (``(..., N)``, bins over ``[0, hist_range]``).

    ``method``: a registered method ('max' returns ``hist_range``); ``options`` e.g.
    ``percentile=99.99``, ``start_bin=128``, ``stride=1``. Returns a float32 tensor of
    ``hist_range``'s shape; the range is a bin edge ``k * range / N``.
    """
    import torch

    spec = get_method(method)
    own = spec.resolve(hist.shape[-1], num_bits, unsigned, options)
    if spec.fn is None:
        return hist_range.detach().float().clone()
    num_bins = hist.shape[-1]
    rng = hist_range.reshape(-1).to(torch.float64)
    h = hist.reshape(-1, num_bins).to(torch.float64)
    k = _resolve(spec.fn)(h, num_bits=num_bits, unsigned=unsigned, **own)
    amax = k.to(torch.float64) * (rng / num_bins)
    return amax.float().reshape(hist_range.shape)


def check_options(method: str, num_bins: int, num_bits: int, unsigned: bool,
                  **options: Any) -> dict[str, Any]:
    """Validate ``method`` and its options for histograms of ``num_bins`` bins."""
    return get_method(method).resolve(num_bins, num_bits, unsigned, options)


_T = "trtqat.quant.calib.thresholds:"
register_method(AmaxMethod.MAX, None, needs_histogram=False, help="the largest |x| seen")
register_method(AmaxMethod.PERCENTILE, _T + "percentile_bins", options={"percentile": 99.99},
                check=_T + "check_percentile",
                help="the edge where the count reaches the percentile")
register_method(AmaxMethod.MSE, _T + "mse_bins", options={"start_bin": 128, "stride": 1},
                check=_T + "check_candidates",
                help="the least fake-quantization mean squared error")
register_method(AmaxMethod.ENTROPY, _T + "entropy_bins", options={"start_bin": 128, "stride": 1},
                check=_T + "check_entropy", weights=False,
                help="TensorRT's KL-divergence threshold")

# calibrators: QuantDescriptor.calib_method -> class (or "module:Class", imported on use)
_CALIBRATORS: dict[str, type | str] = {
    "max": "trtqat.quant.calib.max:MaxCalibrator",
    "histogram": "trtqat.quant.calib.histogram:HistogramCalibrator",
}


def register_calibrator(kind: str, cls: type | str) -> None:
    """Register a Calibrator class (or its ``"module:Class"`` path) as collector ``kind``."""
    _CALIBRATORS[kind] = cls


def calibrator_kinds() -> tuple[str, ...]:
    """The collector kinds ``QuantDescriptor(calib_method=...)`` accepts."""
    return tuple(_CALIBRATORS)


def calibrator_class(kind: str) -> type:
    """The Calibrator class of collector ``kind``."""
    if kind not in _CALIBRATORS:
        raise QuantConfigError(f"calib_method={kind!r} is unknown: use "
                               f"{' or '.join(repr(k) for k in _CALIBRATORS)} (percentile, mse "
                               "and entropy are computed from a histogram)")
    cls = _resolve(_CALIBRATORS[kind])
    _CALIBRATORS[kind] = cls
    return cls


def make_calibrator(kind: str, num_bits: int = 8, axis: Any = None, unsigned: bool = False):
    """A new calibrator of collector ``kind`` ('max' or 'histogram' built in)."""
    return calibrator_class(kind)(num_bits, axis, unsigned)

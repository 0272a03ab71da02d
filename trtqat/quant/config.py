"""``QuantConfig``: how :func:`trtqat.quantize` quantizes and calibrates a model.

A frozen dataclass; a dict with the same keys works too (:meth:`QuantConfig.of`), and an
unknown key is one :class:`~trtqat.errors.QuantConfigError` line that names it, suggests
the closest valid key and lists them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trtqat.checks import check_config_types, check_keys
from trtqat.errors import QuantConfigError, QuantConfigTypeError
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.modules import FLOAT_TO_QUANT


def _descriptor(name: str, value: Any) -> QuantDescriptor | None:
    if value is None or isinstance(value, QuantDescriptor):
        return value
    if isinstance(value, Mapping):
        try:
            return QuantDescriptor(**value)
        except TypeError as exc:
            raise QuantConfigError(f"QuantConfig.{name}: {exc}") from None
    raise QuantConfigError(f"QuantConfig.{name} must be a QuantDescriptor (or a dict of its "
                           f"arguments), got {type(value).__name__}")


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [p for p in value.split(",") if p]
    if not all(isinstance(p, str) for p in value):
        raise QuantConfigError(f"QuantConfig.{name} takes glob patterns (strings), got "
                               f"{value!r}")
    return tuple(value)


@dataclass(frozen=True)
class QuantConfig:
    """How :func:`trtqat.quantize` quantizes a model (every field optional).

    Quantizers:
        quant_desc_input: descriptor of activation quantizers (default: ``num_bits``,
            histogram calibration, so every ``method`` works from one pass).
        quant_desc_weight: descriptor of weight quantizers (default: per output channel).
        num_bits: integer bits of the default descriptors (8).
        float_module_list: torch.nn class names left unquantized, e.g. ``("Linear",)``.
        skip_layers: glob patterns of module names left unquantized (no quantizer at all).
        keep_float: glob patterns of module names quantized but disabled (float on
            purpose; ``trtqat calibrate --skip-layers``), reported as such by the lint.
    Placement (TensorRT's guidance, :mod:`trtqat.quant.placement`):
        graph: place by the traced graph (False: layer inputs and weights only).
        residual: quantize the identity input of residual Adds.
        concat: one shared scale for Concat inputs and their consumers.
        pool: MaxPool input and output share one scale.
        attention: MatMul/BMM operands, scaled_dot_product_attention, nn.MultiheadAttention
            and Hugging Face attention.
        own_forward: quantize Conv/Linear subclasses with a forward of their own (weight
            standardisation: timm's ``ScaledStdConv2d``) through the weight they compute.
        reparameterize: first re-parameterize modules with timm's ``reparameterize()`` /
            ``switch_to_deploy()`` (RepVGG, MobileOne, FastViT: one conv per block), in place.
        untraced_exits: the residual rule sees a conv through a module FX cannot trace whose
            forward returns a child's output (``out = self.proj(out)``; EfficientViT's LiteMLA).
    Format (:mod:`trtqat.formats`):
        format: ``"int8"`` (default), ``"fp8"`` (E4M3 activations and weights, amax maps to
            448) or ``"int4"`` (block-wise INT4 weights of Linear/MatMul layers only, W4A16).
        block_size: int4's weight block along the input channels (32, 64 or 128).
        int4_embeddings: int4 also quantizes ``nn.Embedding`` tables (blocks along the
            embedding dimension): a transformer file shrinks ~3x against fp16 only with it.
    Calibration (with ``forward_loop``):
        method: amax method (max, percentile, mse, entropy, or a registered one); default:
            mse for models with attention, max otherwise (what the CLI families use). fp8:
            max (amax / 448), percentile or mse (scored on the E4M3 grid); entropy refused.
        percentile: kept by ``method="percentile"``.
        num_batches: at most this many batches of an iterable ``forward_loop``.
    """

    quant_desc_input: QuantDescriptor | None = None
    quant_desc_weight: QuantDescriptor | None = None
    float_module_list: tuple[str, ...] = field(default_factory=tuple)
    skip_layers: tuple[str, ...] = field(default_factory=tuple)
    keep_float: tuple[str, ...] = field(default_factory=tuple)
    num_bits: int = 8
    graph: bool = True
    residual: bool = True
    concat: bool = True
    pool: bool = True
    attention: bool = True
    own_forward: bool = True
    reparameterize: bool = True
    untraced_exits: bool = True
    method: str | None = None
    percentile: float = 99.99
    num_batches: int | None = None
    format: str = "int8"
    block_size: int = 128
    int4_embeddings: bool = False

    def __post_init__(self) -> None:
        # bools only bool, numbers finite and not strings, ...: one line naming the key
        check_config_types(self, "QuantConfig", error=QuantConfigTypeError)
        for name in ("quant_desc_input", "quant_desc_weight"):
            object.__setattr__(self, name, _descriptor(name, getattr(self, name)))
        for name in ("float_module_list", "skip_layers", "keep_float"):
            object.__setattr__(self, name, _patterns(name, getattr(self, name)))
        known = {cls.__name__ for cls in FLOAT_TO_QUANT}
        unknown = set(self.float_module_list) - known
        if unknown:
            raise QuantConfigError(f"float_module_list names {sorted(unknown)}; choose from "
                                   f"{sorted(known)}")
        if not isinstance(self.num_bits, int) or not 2 <= self.num_bits <= 16:
            raise QuantConfigError(f"QuantConfig.num_bits must be an integer in [2, 16], got "
                                   f"{self.num_bits!r}")
        from trtqat.formats import BLOCK_SIZES, FORMATS

        if self.format not in FORMATS:
            raise QuantConfigError(f"QuantConfig.format {self.format!r} is not a format: use "
                                   f"one of {', '.join(FORMATS)}")
        if self.block_size not in BLOCK_SIZES:
            raise QuantConfigError(f"QuantConfig.block_size must be one of "
                                   f"{', '.join(map(str, BLOCK_SIZES))}, got {self.block_size!r}")
        if self.format == "int4" and self.method not in (None, "max", "mse"):
            raise QuantConfigError(f"QuantConfig.method {self.method!r} is a histogram method "
                                   "for activations; format int4 (weights only) takes max or mse")
        if self.int4_embeddings and self.format != "int4":
            raise QuantConfigError("QuantConfig.int4_embeddings goes with format 'int4' (INT4 "
                                   f"embedding tables), not {self.format!r}: drop it")
        if self.method is not None:
            from trtqat.quant.calib.registry import methods

            if self.method not in methods():
                raise QuantConfigError(f"QuantConfig.method {self.method!r} is not a "
                                       f"calibration method: use one of {', '.join(methods())}")
            if self.format == "fp8" and self.method == "entropy":
                from trtqat.quant.calib.fp8_mse import ENTROPY_FP8

                raise QuantConfigError(f"QuantConfig.method: {ENTROPY_FP8}")
        if not 0.0 < float(self.percentile) <= 100.0:
            raise QuantConfigError(f"QuantConfig.percentile must be in (0, 100], got "
                                   f"{self.percentile}")
        if self.num_batches is not None and self.num_batches < 1:
            raise QuantConfigError(f"QuantConfig.num_batches must be >= 1, got "
                                   f"{self.num_batches}")

    @classmethod
    def keys(cls) -> list[str]:
        """The valid keys of a config dict."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def of(cls, config: QuantConfig | Mapping[str, Any] | None) -> QuantConfig:
        """``config`` as a QuantConfig (a dict's unknown key is a one-line error)."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if not isinstance(config, Mapping):
            raise QuantConfigError(f"config must be a QuantConfig or a dict, got "
                                   f"{type(config).__name__}")
        check_keys("QuantConfig", config, cls.keys(), QuantConfigError)
        return cls(**dict(config))

    def input_descriptor(self) -> QuantDescriptor:
        """The activation descriptor: ``quant_desc_input`` or ``num_bits`` bits, histogram."""
        return self.quant_desc_input or QuantDescriptor(num_bits=self.num_bits,
                                                        calib_method="histogram")

    def rules(self) -> frozenset[str]:
        """The placement rules this config enables."""
        on = {"residual-add": self.residual, "concat": self.concat, "maxpool": self.pool,
              "matmul": self.attention, "sdpa": self.attention}
        return frozenset(k for k, v in on.items() if v and self.graph)

"""Turn a model's placed (INT8) quantizers into another format of :mod:`trtqat.formats`.

Placement is format-blind: :func:`trtqat.quantize` places TensorRT's Q/DQ as for INT8, then
:func:`apply_format` changes what the quantizers compute. ``int8`` changes nothing; ``fp8``
makes every quantizer FP8 E4M3 (:mod:`trtqat.quant.fp8`); ``int4`` keeps only block-wise
INT4 weight quantizers of Linear layers (:mod:`trtqat.quant.blockwise`).
"""

from __future__ import annotations

from torch import nn

from trtqat.formats import DEFAULT_BLOCK_SIZE, fmt
from trtqat.quant.descriptor import E4M3
from trtqat.quant.model_ops import quantizers


def apply_format(model: nn.Module, name: str, block_size: int = DEFAULT_BLOCK_SIZE,
                 embeddings: bool = False) -> None:
    """Make ``model``'s quantizers ``name`` (a :data:`trtqat.formats.FORMATS` entry), in
    place; before calibration (amax kept otherwise, as amax means the same range).
    ``embeddings``: int4 also makes the ``nn.Embedding`` tables INT4."""
    fmt(name)  # checked
    if name == "fp8":
        to_fp8(model)
    elif name == "int4":
        from trtqat.quant.blockwise import to_int4_weights

        to_int4_weights(model, block_size, embeddings)


def to_fp8(model: nn.Module) -> None:
    """Every quantizer of ``model`` FP8 E4M3 (activations per tensor, weights as placed);
    small convolutions and average pooling stay float
    (:func:`trtqat.quant.fp8_layers.keep_float_in_fp8`)."""
    from trtqat.quant.fp8_layers import keep_float_in_fp8

    for _, q in quantizers(model):
        q.num_bits = E4M3  # any attribute set re-decides the quantizer's fast path
        q._unsigned = False
    keep_float_in_fp8(model)


def check_format_layers(model: nn.Module, name: str) -> None:
    """After skip_layers / keep_float: a one-line error naming the quantized layers TensorRT
    cannot run in format ``name`` (fp8: :func:`trtqat.quant.fp8_layers.check_fp8_layers`)."""
    if name == "fp8":
        from trtqat.quant.fp8_layers import check_fp8_layers

        check_fp8_layers(model)

"""Hugging Face encoders: the attention plugin (:mod:`trtqat.quant.plugins.attention`) plus
TensorRT's placement (:mod:`trtqat.quant.placement`) for every module around it."""

from __future__ import annotations

from torch import nn

from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.model_ops import QuantConfig, name_quantizers
from trtqat.quant.placement import place
from trtqat.quant.plugins.attention import QUANT_DESC_ACTIVATION, quantize_attention
from trtqat.quant.plugins.matmul import QuantMatMul


def quantize_transformer(model: nn.Module, quant_desc_input: QuantDescriptor | None = None,
                         skip_layers: tuple[str, ...] = ()) -> nn.Module:
    """Quantize a Hugging Face encoder in place: Linear layers and the attention matmuls.

    Linear weights are quantized per row (max calibration), every activation per tensor
    with ``quant_desc_input`` (default: 8-bit, histogram calibration); the rest of TensorRT's
    placement (:func:`trtqat.quant.placement.place`) applies to any module around the encoder. ``skip_layers``
    globs (e.g. ``"*.layer.0.*"``) keep matching Linear layers, and the attention matmuls
    of matching attention modules, in float. Returns ``model``.
    """
    desc = quant_desc_input or QUANT_DESC_ACTIVATION
    quantize_attention(model, desc)  # raises when the model has no attention to quantize
    place(model, QuantConfig(quant_desc_input=desc, skip_layers=tuple(skip_layers)))
    if skip_layers:
        from trtqat.quant.model_ops import skipped

        for name, m in model.named_modules():
            if isinstance(m, QuantMatMul) and skipped(name, skip_layers):
                m.input_quantizer.disable()
                m.other_quantizer.disable()
    name_quantizers(model)
    return model

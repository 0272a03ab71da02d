"""``nn.modules._utils``: the mixins that give layers their quantizers."""

from trtqat.quant.mixin import QuantInputMixin, QuantMixin, pop_quant_desc_in_kwargs

__all__ = ["QuantInputMixin", "QuantMixin", "pop_quant_desc_in_kwargs"]

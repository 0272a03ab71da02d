"""``F.scaled_dot_product_attention`` with quantized matrix products.

The fused call hides both products of attention from Q/DQ placement, so the placement
replaces it by :class:`QuantSDPA`: the same computation written out, ``Q @ K^T`` and
``P @ V`` through two :class:`~trtqat.quant.plugins.matmul.QuantMatMul` (``matmul_qk``,
``matmul_av``), the scaling, masks and softmax in float (TensorRT's attention placement).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.plugins.matmul import QuantMatMul


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True = attend) as an additive float mask, a float mask unchanged."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, float("-inf"))


def causal_mask(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """The additive mask of causal attention (-inf above the diagonal)."""
    keep = torch.ones(rows, cols, dtype=torch.bool, device=like.device).tril()
    return torch.zeros(rows, cols, dtype=like.dtype, device=like.device).masked_fill(
        ~keep, float("-inf"))


class QuantSDPA(nn.Module):
    """``F.scaled_dot_product_attention`` with both products fake-quantized per tensor."""

    def __init__(self, quant_desc_input: QuantDescriptor | None = None) -> None:
        super().__init__()
        self.matmul_qk = QuantMatMul(quant_desc_input)
        self.matmul_av = QuantMatMul(quant_desc_input)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> torch.Tensor:
        if scale is None:
            scale = 1.0 / math.sqrt(query.size(-1))
        if enable_gqa and key.size(-3) != query.size(-3):
            repeat = query.size(-3) // key.size(-3)
            key = key.repeat_interleave(repeat, dim=-3)
            value = value.repeat_interleave(repeat, dim=-3)
        scores = self.matmul_qk(query, key.transpose(-2, -1)) * scale
        if is_causal:
            scores = scores + causal_mask(query.size(-2), key.size(-2), scores)
        mask = additive_mask(attn_mask, scores.dtype)
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p, training=True)
        return self.matmul_av(weights, value)

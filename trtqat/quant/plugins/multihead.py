"""``nn.MultiheadAttention`` quantized in place: same parameters, same state_dict keys.

:func:`quantize_multihead` turns a module into a :class:`QuantMultiheadAttention` (a
subclass, so ``isinstance`` and torchvision/PyTorch weights keep working) that computes the
attention itself instead of ``F.multi_head_attention_forward``: the input projections with
a quantized input and per-row quantized weight, ``Q @ K^T`` and ``P @ V`` through two
``QuantMatMul`` (``matmul_qk``, ``matmul_av``), the output projection as a ``QuantLinear``.
Masks (``key_padding_mask``, ``attn_mask``, ``is_causal``), ``batch_first`` either way,
unbatched inputs, ``kdim``/``vdim`` and ``need_weights`` behave as in PyTorch; ``bias_k`` /
``add_zero_attn`` modules are left in float (:func:`supported` says why).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.modules import QuantLinear
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.plugins.sdpa import additive_mask, causal_mask
from trtqat.quant.tensor_quantizer import TensorQuantizer


def supported(mha: nn.MultiheadAttention) -> str | None:
    """Why ``mha`` cannot be quantized (None when it can)."""
    if mha.bias_k is not None or mha.bias_v is not None:
        return "it has bias_k/bias_v"
    if mha.add_zero_attn:
        return "it has add_zero_attn"
    return None


class QuantMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` with TensorRT's attention Q/DQ placement (see module doc)."""

    def _in(self, x: torch.Tensor, which: str) -> torch.Tensor:
        q = getattr(self, f"_{which}_input_quantizer", None) or self._input_quantizer
        return q(x)

    def _projections(self, query, key, value):
        e = self.embed_dim
        if self._qkv_same_embed_dim and key is query and value is query:
            w = self._weight_quantizer(self.in_proj_weight)
            return F.linear(self._input_quantizer(query), w, self.in_proj_bias).chunk(3, -1)
        q_in = self._input_quantizer(query)
        k_in = q_in if key is query else self._in(key, "key")
        v_in = k_in if value is key else (q_in if value is query else
                                          self._in(value, "value"))
        bias = self.in_proj_bias
        biases = (None, None, None) if bias is None else bias.split(e)
        if self._qkv_same_embed_dim:
            w = self._weight_quantizer(self.in_proj_weight).split(e)
        else:
            w = (self._q_weight_quantizer(self.q_proj_weight),
                 self._k_weight_quantizer(self.k_proj_weight),
                 self._v_weight_quantizer(self.v_proj_weight))
        return (F.linear(q_in, w[0], biases[0]), F.linear(k_in, w[1], biases[1]),
                F.linear(v_in, w[2], biases[2]))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            same_k, same_v = key is query, value is key
            query = query.transpose(0, 1)
            key = query if same_k else key.transpose(0, 1)
            value = key if same_v else value.transpose(0, 1)
        q, k, v = self._projections(query, key, value)
        n, length, heads = q.size(0), q.size(1), self.num_heads
        q = q.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)  # (N, H, L, D)
        k = k.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)
        v = v.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)
        scores = self.matmul_qk(q, k.transpose(-2, -1)) * (self.head_dim ** -0.5)
        mask = self._mask(key_padding_mask, attn_mask, is_causal, n, length, k.size(2), scores)
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        if self.training and self.dropout > 0.0:
            weights = F.dropout(weights, p=self.dropout)
        out = self.matmul_av(weights, v).transpose(1, 2).flatten(2)  # (N, L, E)
        out = self.out_proj(out)
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = weights.mean(1) if average_attn_weights else weights
        return out, weights.squeeze(0) if unbatched else weights

    def _mask(self, key_padding_mask, attn_mask, is_causal, n, length, source, like):
        mask = additive_mask(_attend(attn_mask), like.dtype)
        if mask is None and is_causal:
            mask = causal_mask(length, source, like)
        if mask is not None and mask.dim() == 3:  # (N * H, L, S)
            mask = mask.view(n, self.num_heads, length, source)
        padding = additive_mask(_attend(key_padding_mask), like.dtype)
        if padding is not None:
            padding = padding.view(n, 1, 1, source)
            mask = padding if mask is None else mask + padding
        return mask


def _attend(mask: torch.Tensor | None) -> torch.Tensor | None:
    """PyTorch's MHA masks are True where attention is *not* allowed: flip boolean ones."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return ~mask


def quantize_multihead(mha: nn.MultiheadAttention, desc_input: QuantDescriptor,
                       desc_weight: QuantDescriptor, separate_inputs: bool = False) -> None:
    """Turn ``mha`` into a :class:`QuantMultiheadAttention` in place (parameters kept).

    ``separate_inputs`` gives key and value their own input quantizers (cross-attention);
    otherwise one input quantizer serves every input, as in self-attention.
    """
    mha.__class__ = QuantMultiheadAttention
    mha._input_quantizer = TensorQuantizer(desc_input)
    if separate_inputs or not mha._qkv_same_embed_dim:
        mha._key_input_quantizer = TensorQuantizer(desc_input)
        mha._value_input_quantizer = TensorQuantizer(desc_input)
    if mha._qkv_same_embed_dim:
        mha._weight_quantizer = TensorQuantizer(desc_weight)
    else:
        for which in ("q", "k", "v"):
            setattr(mha, f"_{which}_weight_quantizer", TensorQuantizer(desc_weight))
    if not isinstance(mha.out_proj, QuantLinear):
        mha.out_proj = QuantLinear.from_float(mha.out_proj, desc_input, None)
    mha.matmul_qk = QuantMatMul(desc_input)
    mha.matmul_av = QuantMatMul(desc_input)

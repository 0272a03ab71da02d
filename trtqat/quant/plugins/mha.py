"""``nn.MultiheadAttention`` made quantizable: an equivalent module with separate q/k/v
Linear layers whose attention core is :func:`trtqat.quant.plugins.attention.
quant_attention_forward` (``QuantMatMul`` on Q·Kᵀ and P·V once quantized)."""

from __future__ import annotations

import torch
from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.quant.plugins.attention import quant_attention_forward

QKV = ("q_proj", "k_proj", "v_proj")


class AttentionConfigError(QuantConfigError):
    """An attention module that cannot be replaced as it is configured."""


class QuantizableMHA(nn.Module):
    """``nn.MultiheadAttention`` (batch-first, no masks) with separate q/k/v Linear layers.

    The core is the encoder family's attention: ``softmax(Q @ K^T * scaling) @ V`` through
    the module's ``matmul_qk`` / ``matmul_av`` (``QuantMatMul``) once quantized, plain
    ``torch.matmul`` before. Called like the module it replaces, ``(query, key, value,
    need_weights=False)`` -> ``(output, weights or None)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise AttentionConfigError(f"hidden size {embed_dim} is not divisible by {num_heads} "
                                 "heads: choose a head count that divides it")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention) -> QuantizableMHA:
        """The equivalent module, holding copies of ``mha``'s weights."""
        if not (mha._qkv_same_embed_dim and mha.batch_first) or mha.bias_k is not None \
                or mha.add_zero_attn:
            raise AttentionConfigError("only batch-first self-attention without bias_k/bias_v or "
                                 "zero attention (torchvision's ViT) can be quantized")
        bias = mha.in_proj_bias is not None
        new = cls(mha.embed_dim, mha.num_heads, mha.dropout, bias)
        new.to(device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
        with torch.no_grad():
            for i, name in enumerate(QKV):
                rows = slice(i * mha.embed_dim, (i + 1) * mha.embed_dim)
                getattr(new, name).weight.copy_(mha.in_proj_weight[rows])
                if bias:
                    getattr(new, name).bias.copy_(mha.in_proj_bias[rows])
            new.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.out_proj.bias is not None:
                new.out_proj.bias.copy_(mha.out_proj.bias)
        new.train(mha.training)
        return new

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = False,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if key_padding_mask is not None or attn_mask is not None or is_causal:
            raise AttentionConfigError("QuantizableMHA takes no attention mask (a ViT attends to "
                                 "every patch)")
        heads = (self.num_heads, self.head_dim)
        q = self.q_proj(query).unflatten(-1, heads).transpose(1, 2)  # (N, H, L, D)
        k = self.k_proj(key).unflatten(-1, heads).transpose(1, 2)
        v = self.v_proj(value).unflatten(-1, heads).transpose(1, 2)
        out, weights = quant_attention_forward(self, q, k, v, None, scaling=self.scaling,
                                         dropout=self.dropout)
        out = self.out_proj(out.flatten(2))  # (N, L, H, D) -> (N, L, E)
        if not need_weights:
            return out, None
        return out, weights.mean(1) if average_attn_weights else weights


def fuse_qkv_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state_dict with :class:`QuantizableMHA` keys turned back into torchvision's
    (``in_proj_weight``/``in_proj_bias``); quantizer buffers of the projections dropped."""
    out = dict(state)
    for key in [k for k in state if k.endswith(".q_proj.weight")]:
        prefix = key[: -len("q_proj.weight")]
        for param in ("weight", "bias"):
            parts = [f"{prefix}{p}.{param}" for p in QKV]
            if all(p in state for p in parts):
                out[f"{prefix}in_proj_{param}"] = torch.cat([state[p] for p in parts])
                for p in parts:
                    out.pop(p)
        for k in [k for k in out if k.startswith(tuple(f"{prefix}{p}." for p in QKV))]:
            out.pop(k)  # the projections' quantizer buffers
    return out


def replace_attention(model: nn.Module) -> int:
    """Replace every ``nn.MultiheadAttention`` of ``model`` by a :class:`QuantizableMHA`
    holding its weights (in place); returns how many were replaced."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.MultiheadAttention):
                setattr(parent, name, QuantizableMHA.from_mha(child))
                count += 1
    return count


ViTSelfAttention = QuantizableMHA  # the name the ViT family first gave it

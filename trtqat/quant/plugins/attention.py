"""Quantized attention for Hugging Face BERT-family models, without editing their source.

transformers (>= 4.48, 5.x) routes the core of every self-attention through a registry,
``AttentionInterface``: a module calls ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]
(module, query, key, value, attention_mask, scaling=..., dropout=...)``. We register one
more implementation, ``"trtqat_int8"``, that computes exactly what the library's eager
attention computes but sends both products through the module's own :class:`QuantMatMul`
children (``matmul_qk`` for ``Q @ K^T``, ``matmul_av`` for ``softmax(..) @ V``). The mask
builder registered under the same name is the library's eager one (additive float mask).

So a model is quantized by (1) attaching two QuantMatMul to each attention module,
(2) ``model.set_attn_implementation("trtqat_int8")`` and (3) ``trtqat.quantize`` for the
Linear layers (per-row weights, per-tensor inputs). LayerNorm, GELU and Softmax stay float:
this is TensorRT's Q/DQ placement for multi-head attention (every GEMM/MatMul input
quantized, both operands of the attention matmuls included).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.model_ops import QuantConfig, modules_of, name_quantizers
from trtqat.quant.plugins.matmul import QuantMatMul

log = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "trtqat_int8"
# Activations use a histogram so that max, percentile, mse and entropy all come from one pass.
QUANT_DESC_ACTIVATION = QuantDescriptor(num_bits=8, calib_method="histogram")
INSTALL_HINT = "pip install 'trtqat[transformers]'"


def require_transformers():
    """Import ``transformers`` or raise a TrtqatError with the install hint."""
    try:
        import transformers
    except ImportError:  # pragma: no cover - depends on the environment
        raise QuantConfigError(
            f"quantizing a transformer needs the transformers package: {INSTALL_HINT}"
        ) from None
    return transformers


def quant_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            scaling: float | None = None, dropout: float = 0.0,
                            **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention with the two matmuls replaced by the module's QuantMatMul.

    A module without ``matmul_qk``/``matmul_av`` computes plain float matmuls, so the
    result is then bit-for-bit the library's eager attention.
    """
    matmul_qk = getattr(module, "matmul_qk", None) or torch.matmul
    matmul_av = getattr(module, "matmul_av", None) or torch.matmul
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    attn_weights = matmul_qk(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = matmul_av(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


def register_attention() -> None:
    """Register ``"trtqat_int8"`` with transformers' attention and mask registries (idempotent)."""
    require_transformers()
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, quant_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)


def attention_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The attention modules of ``model`` that call the attention interface.

    They are recognised the way transformers passes them: a module holding the model
    ``config`` and an ``is_causal`` flag, and at least one Linear projection.
    """
    transformers = require_transformers()
    for name, m in model.named_modules():
        if isinstance(m, transformers.PreTrainedModel):
            continue
        if hasattr(m, "config") and hasattr(m, "is_causal") and any(
            isinstance(c, nn.Linear) for c in m.children()
        ):
            yield name, m


def _pretrained_roots(model: nn.Module) -> list[nn.Module]:
    transformers = require_transformers()
    roots, inside = [], set()
    for name, m in model.named_modules():
        if isinstance(m, transformers.PreTrainedModel) and not any(
            name.startswith(p + ".") or p == "" for p in inside
        ):
            roots.append(m)
            inside.add(name)
    return roots


def quantize_attention(model: nn.Module, quant_desc: QuantDescriptor | None = None) -> list[str]:
    """Give every attention module of ``model`` a ``matmul_qk`` and a ``matmul_av``.

    Switches the model to the ``"trtqat_int8"`` attention implementation; returns the names
    of the attention modules. Raises when the model's attention does not go through
    transformers' AttentionInterface (nothing could be wired then).
    """
    register_attention()
    desc = quant_desc or QUANT_DESC_ACTIVATION
    names = []
    for name, m in attention_modules(model):
        if not isinstance(getattr(m, "matmul_qk", None), QuantMatMul):
            m.matmul_qk = QuantMatMul(desc)
        if not isinstance(getattr(m, "matmul_av", None), QuantMatMul):
            m.matmul_av = QuantMatMul(desc)
        names.append(name)
    roots = _pretrained_roots(model)
    if not names or not roots:
        raise QuantConfigError(
            f"{type(model).__name__} has no attention module that trtqat can quantize: it "
            "supports Hugging Face BERT-family models whose attention uses AttentionInterface"
        )
    for root in roots:
        root.set_attn_implementation(ATTN_IMPLEMENTATION)
        if root.config._attn_implementation != ATTN_IMPLEMENTATION:
            raise QuantConfigError(
                f"{type(root).__name__} does not let its attention implementation be set, so "
                "its attention matmuls cannot be quantized; use a BERT-family model whose "
                "attention uses transformers' AttentionInterface"
            )
    return names


def quantize_transformer(model: nn.Module, quant_desc_input: QuantDescriptor | None = None,
                         skip_layers: tuple[str, ...] = ()) -> nn.Module:
    """Quantize a Hugging Face encoder in place: Linear layers and the attention matmuls.

    Linear weights are quantized per row (max calibration), every activation per tensor
    with ``quant_desc_input`` (default: 8-bit, histogram calibration); the rest of TensorRT's
    placement (:func:`trtqat.quant.placement.place`) applies to any module around the encoder. ``skip_layers``
    globs (e.g. ``"*.layer.0.*"``) keep matching Linear layers, and the attention matmuls
    of matching attention modules, in float. Returns ``model``.
    """
    from trtqat.quant.placement import place

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


def quant_matmuls(model: nn.Module) -> Iterator[tuple[str, QuantMatMul]]:
    """Every QuantMatMul of ``model`` with its qualified name."""
    return modules_of(model, QuantMatMul)

"""INT4 block-wise weights of Linear layers, float activations (W4A16; format ``int4``).

:func:`to_int4_weights` turns a placed model's quantizers into weight-only INT4: every
activation quantizer is switched off (disabled and marked ``_format_off``, so it neither
quantizes, nor exports, nor counts as a layer left in float on purpose) and every Linear
weight quantizer becomes a :class:`BlockQuantizer`: symmetric, one amax per block of
``block_size`` consecutive input channels of each output row, scale ``amax / 7``, codes
``round_half_even(w / scale)`` clipped to ``[-7, 7]``. Narrow range, as TensorRT's INT4 is
symmetric: a block clipped below its maximum (mse) loses the same on both sides, and a
max-calibrated block never reaches -8 anyway. Conv layers keep float weights (one NOTE line).

The block amax comes from the weight: ``max`` (per block) or ``mse`` (:mod:`.block_amax`);
QAT learns it (:meth:`BlockQuantizer.init_learn_amax`, the LSQ-style gradient of the
learnable-amax path). The export folds each quantized weight to its fake-quantized value
(:func:`fold_block_weights`) and :mod:`trtqat.export.int4_weights` stores it as INT4 codes
-> ``DequantizeLinear(axis, block_size)``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.errors import QuantConfigError, QuantizerStateError
from trtqat.formats import BLOCK_SIZES
from trtqat.quant import export_mode
from trtqat.quant._fused import scale_of
from trtqat.quant.block_amax import BlockCalibrator, block_amax, block_fix, blocks_of
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.functional import _FakeQuant, _FakeQuantLearnable, onnx_exporting
from trtqat.quant.model_ops import name_quantizers, quantizers
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)

INT4_MIN, INT4_MAX = -7, 7
# the tensor each weight quantizer of nn.MultiheadAttention reads (others read "weight")
_MHA_WEIGHTS = {"_weight_quantizer": "in_proj_weight", "_q_weight_quantizer": "q_proj_weight",
                "_k_weight_quantizer": "k_proj_weight", "_v_weight_quantizer": "v_proj_weight"}


class BlockQuantizer(TensorQuantizer):
    """A Linear weight's INT4 quantizer: one amax per block of ``block_size`` input
    channels of each output row (amax of shape ``(out, in / block_size)``)."""

    def __init__(self, block_size: int) -> None:
        if block_size not in BLOCK_SIZES:
            raise QuantConfigError(f"block_size must be one of "
                                   f"{', '.join(map(str, BLOCK_SIZES))}, got {block_size!r}")
        super().__init__(QuantDescriptor(num_bits=4, narrow_range=True, axis=(0,)))
        self.block_size = block_size
        self._calibrator = BlockCalibrator(block_size)

    def _blocks(self, w: torch.Tensor) -> torch.Tensor:
        if w.dim() != 2:
            raise QuantConfigError(
                f"{self._label()}: INT4 block-wise weights are for Linear/MatMul layers (2-D "
                f"weights), not a weight of shape {tuple(w.shape)} (a conv): keep convs float "
                "(format int4 does) or quantize them with format int8 or fp8")
        try:
            return blocks_of(w, self.block_size)
        except QuantConfigError as exc:
            raise self._named(exc) from None

    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """The stored block amax (``(out, blocks)``), else the weight's own block maxima."""
        amax = self._amax
        if amax is None:
            amax = block_amax(inputs.detach(), self.block_size, "max")
        elif tuple(amax.shape) != tuple(self._blocks(inputs).shape[:2]):
            raise QuantizerStateError(
                f"{self._label()}: block amax of shape {tuple(amax.shape)} does not fit a "
                f"weight of shape {tuple(inputs.shape)} in blocks of {self.block_size}; "
                "calibrate again or load this layer's amax")
        return amax

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        blocks = self._blocks(inputs)
        amax = self._get_amax(inputs).unsqueeze(-1)
        if (export_mode.entered and export_mode.active()) or onnx_exporting() \
                or TensorQuantizer.use_fb_fake_quant:
            raise QuantizerStateError(
                f"{self._label()}: an INT4 weight is exported folded (trtqat's exporter does "
                "it; the weight must be a Linear layer's parameter): export with "
                "trtqat.export_onnx / `trtqat export --variant int4`")
        if "_amax" in self._parameters:  # learned (init_learn_amax)
            out = _FakeQuantLearnable.apply(blocks, amax.abs().clamp_min(1e-8), INT4_MIN,
                                            INT4_MAX)
        else:
            out = _FakeQuant.apply(blocks, amax.detach(), INT4_MIN, INT4_MAX)
        return out.reshape(inputs.shape)

    def _bounds(self) -> tuple[int, int]:
        return INT4_MIN, INT4_MAX

    def init_learn_amax(self) -> None:
        """Learn the block amax (an ``nn.Parameter``, LSQ-style gradient) from the stored one."""
        super().init_learn_amax()

    def scales(self, weight: torch.Tensor) -> torch.Tensor:
        """The float32 block scales ``amax / 7`` (``(out, blocks)``) ``weight`` uses."""
        return scale_of(self._get_amax(weight).detach(), INT4_MAX)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()} int4 block={self.block_size}"


class FormatOff(TensorQuantizer):
    """A placed quantizer the format has no use for (int4's activations): disabled for
    good, so that calibration switches and sensitivity sweeps cannot turn it on."""

    def enable(self) -> None:
        """Stays disabled (the format quantizes no such tensor)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` unquantized; times ``pre_quant_scale`` when AWQ scaling set one (in
        every variant: the layer's weight holds the inverse, :mod:`trtqat.quant.awq`)."""
        pqs = self._buffers.get("_pre_quant_scale")
        return inputs if pqs is None else inputs * pqs.to(inputs.device, inputs.dtype)


def is_block(q: nn.Module) -> bool:
    """True for an INT4 block-wise weight quantizer."""
    return isinstance(q, BlockQuantizer)


def _weight_of(module: nn.Module, attr: str) -> torch.Tensor | None:
    name = _MHA_WEIGHTS.get(attr) if isinstance(module, nn.MultiheadAttention) else "weight"
    w = getattr(module, name or "", None)
    return w if isinstance(w, torch.Tensor) else None


def _weight_quantizers(model: nn.Module):
    """``(module name, module, attribute, quantizer)`` of every weight quantizer."""
    for name, module in model.named_modules():
        for attr, q in list(module._modules.items()):
            if isinstance(q, TensorQuantizer) and attr.endswith("weight_quantizer"):
                yield name, module, attr, q


def int4_weight_quantizer(module: nn.Module, attr: str, block_size: int, name: str = ""
                          ) -> BlockQuantizer:
    """Give ``module``'s weight quantizer ``attr`` INT4 blocks of ``block_size``; returns it.

    A conv (a weight that is not 2-D) and a ``block_size`` that does not divide the layer's
    input channels are one-line :class:`QuantConfigError`s naming the fix."""
    label = name or type(module).__name__
    w = _weight_of(module, attr)
    if isinstance(module, nn.modules.conv._ConvNd) or (w is not None and w.dim() != 2):
        raise QuantConfigError(
            f"{label}: INT4 block-wise weights are for Linear/MatMul layers, not a "
            f"{type(module).__name__}: keep convs float (format int4 does by itself) or use "
            "format int8 or fp8 for them")
    if w is not None and w.shape[1] % block_size:
        raise QuantConfigError(
            f"{label}: block_size {block_size} does not divide its in_features "
            f"{w.shape[1]}: {block_fix(int(w.shape[1]))}")
    old = getattr(module, attr)
    q = BlockQuantizer(block_size)
    q._name = old._name
    if old.disabled:
        q.disable()
    setattr(module, attr, q)
    return q


class Int4Embedding(nn.Embedding):
    """``nn.Embedding`` whose table is INT4 blocks along the embedding dimension (each
    token's row in blocks of ``block_size``): exported as INT4 codes -> DequantizeLinear ->
    Gather. Opt-in (``to_int4_weights(..., embeddings=True)``): it shrinks a file whose
    embedding table dominates (all-MiniLM-L6-v2: half its parameters)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.embedding(input, self._weight_quantizer(self.weight), self.padding_idx,
                           self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)


def _int4_embeddings(model: nn.Module, block_size: int) -> int:
    count = 0
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Embedding:
            continue
        dim = int(module.embedding_dim)
        if dim % block_size:
            raise QuantConfigError(
                f"{name}: block_size {block_size} does not divide its embedding_dim {dim}: "
                "leave the embedding tables float (embeddings=False)"
                + ("" if dim % 32 else " or use block_size 32"))
        module.__class__ = Int4Embedding
        module._weight_quantizer = BlockQuantizer(block_size)
        count += 1
    return count


def to_int4_weights(model: nn.Module, block_size: int, embeddings: bool = False) -> int:
    """Make ``model``'s placed quantizers weight-only INT4 (see the module doc), in place;
    ``embeddings`` also makes every ``nn.Embedding`` table INT4 (:class:`Int4Embedding`).
    Returns the number of INT4 weights. A model without a Linear weight to quantize is a
    one-line :class:`QuantConfigError`."""
    name_quantizers(model)
    linear, convs = [], []
    for name, module, attr, _ in list(_weight_quantizers(model)):
        w = _weight_of(module, attr)
        if isinstance(module, nn.modules.conv._ConvNd) or (w is not None and w.dim() != 2):
            convs.append(name)
            continue
        linear.append((name, module, attr))
    if not linear:
        raise QuantConfigError(
            f"format int4 quantizes Linear/MatMul weights only, and {type(model).__name__} has "
            "none to quantize (convs keep float weights): use format int8 or fp8 for it")
    for name, module, attr in linear:
        int4_weight_quantizer(module, attr, block_size, name)
    tables = _int4_embeddings(model, block_size) if embeddings else 0
    for _, q in quantizers(model):
        if not is_block(q):
            q.disable()
            q.__class__ = FormatOff
            q._format_off = True  # not "float on purpose": the format has no such quantizer
    if convs:
        shown = ", ".join(convs[:4]) + (f" (+{len(convs) - 4} more)" if len(convs) > 4 else "")
        log.warning("NOTE format int4 quantizes Linear weights only: %d conv layer(s) keep "
                    "float weights: %s", len(convs), shown)
    name_quantizers(model)
    return len(linear) + tables


@torch.no_grad()
def fold_block_weights(model: nn.Module) -> int:
    """For export: each INT4 weight becomes its fake-quantized value (in place), its
    quantizer disabled and holding ``_export_block = (weight, scales, block_size)`` (numpy)
    for :func:`trtqat.export.int4_weights.int4_initializers`. Returns how many."""
    count = 0
    for _, module, attr, q in list(_weight_quantizers(model)):
        if not is_block(q) or q.disabled:
            continue
        w = _weight_of(module, attr)
        if w is None:
            continue  # a weight passed at call time (F.linear): refused when traced
        folded = q(w.detach()).float()
        q._export_block = (folded.cpu().numpy(), q.scales(w).cpu().numpy(), q.block_size)
        w.data.copy_(folded.to(w.dtype))
        q.disable()
        count += 1
    return count


def export_blocks(model: nn.Module) -> list[tuple]:
    """The ``_export_block`` of every folded INT4 weight of ``model``."""
    return [q._export_block for _, q in quantizers(model) if hasattr(q, "_export_block")]


def has_int4(model: nn.Module) -> bool:
    """True if ``model`` holds an INT4 block-wise weight quantizer."""
    return any(is_block(q) for _, q in quantizers(model))

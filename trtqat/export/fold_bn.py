"""Fold BatchNorm into the convolution before it, keeping weight quantization exact.

Folding scales output channel ``c`` of the weight by ``s_c = gamma_c / sqrt(var_c + eps)``.
A per-channel weight quantizer stays exact when its amax scales by ``|s_c|`` too: the step
``amax_c / 127`` scales by the same factor as the weights, so every integer code is the same
(negated where ``s_c < 0``); the dequantized weights are folded, so that no code sits on a
rounding tie. A per-tensor weight quantizer cannot follow a per-channel scale;
it is recalibrated to the folded weights' maximum, which changes its rounding (logged).
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd

from trtqat.quant.mixin import QUANT_LAYERS
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)


class _Tracer(fx.Tracer):
    """Keeps Quant* layers and quantizers whole, so conv -> bn edges are visible."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (TensorQuantizer, *QUANT_LAYERS, _ConvNd, _BatchNorm)):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def find_conv_bn_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """``(conv, bn)`` module names where the BatchNorm takes only that conv's output.

    Uses a torch.fx trace; if the model cannot be traced, falls back to adjacent
    ``conv, bn`` children of ``nn.Sequential`` containers (which chain by construction).
    """
    modules = dict(model.named_modules())
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:  # untraceable user model: fall back to what is certain
        log.debug("fx trace failed (%s); folding BatchNorm inside nn.Sequential only", exc)
        return _sequential_pairs(model)
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), _BatchNorm):
            continue
        if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
            continue
        prev = node.args[0]
        if prev.op != "call_module" or not isinstance(modules.get(prev.target), _ConvNd):
            continue
        if len(prev.users) == 1 and calls[prev.target] == 1 and calls[node.target] == 1:
            pairs.append((prev.target, node.target))
    return pairs


def _sequential_pairs(model: nn.Module) -> list[tuple[str, str]]:
    pairs = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        for (cname, conv), (bname, bn) in zip(children, children[1:]):
            if isinstance(conv, _ConvNd) and isinstance(bn, _BatchNorm):
                prefix = f"{name}." if name else ""
                pairs.append((prefix + cname, prefix + bname))
    return pairs


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


@torch.no_grad()
def fold_conv_bn(conv: _ConvNd, bn: _BatchNorm) -> bool:
    """Fold ``bn`` into ``conv`` in place (weights, bias, weight amax); False if impossible."""
    if bn.running_mean is None or bn.running_var is None:
        return False
    transposed = isinstance(conv, _ConvTransposeNd)
    if transposed and conv.groups != 1:
        return False
    w = conv.weight
    out_ch = w.shape[1] if transposed else w.shape[0]
    if bn.num_features != out_ch:
        return False
    scale = bn.running_var.double().add(bn.eps).rsqrt()
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    shift = -bn.running_mean.double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.double()
    shape = [1, -1] if transposed else [-1]
    shape += [1] * (w.dim() - len(shape))
    quantizer = getattr(conv, "_weight_quantizer", None)
    source = w
    if (isinstance(quantizer, TensorQuantizer) and quantizer._amax is not None
            and not quantizer.disabled and quantizer.amax.numel() == out_ch):
        # fold the weights PyTorch uses, the dequantized codes: (k * step) * s over
        # step * |s| is +-k up to float error, so no code sits on a rounding tie and flips
        # (folding the raw float weights flips the rare weight at a tie; one flipped code
        # shifts a whole channel, which deep untrained models amplify to many steps)
        source = quantizer(w)
    new_w = (source.double() * scale.reshape(shape)).to(w.dtype)
    bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(scale)
    new_b = (bias * scale + shift).to(w.dtype)
    conv.weight = nn.Parameter(new_w, requires_grad=w.requires_grad)
    conv.bias = nn.Parameter(new_b, requires_grad=w.requires_grad)
    if isinstance(quantizer, TensorQuantizer) and quantizer._amax is not None:
        amax = quantizer._amax.detach()
        if amax.numel() == out_ch:
            new_amax = (amax.double() * scale.abs().reshape(amax.shape)).to(amax.dtype)
        else:
            new_amax = new_w.detach().abs().max().to(amax.dtype).reshape(amax.shape)
            log.warning("%s has a per-tensor weight quantizer: after folding BatchNorm its "
                        "amax is recalibrated, so its rounding changes; quantize weights per "
                        "channel for an exact fold", quantizer._name or "a conv")
        if isinstance(quantizer._amax, nn.Parameter):
            quantizer._amax.data = new_amax
        else:
            quantizer._amax = new_amax
    return True


def fold_batchnorm(model: nn.Module, inplace: bool = False) -> nn.Module:
    """A copy of ``model`` (eval mode) with every conv -> BatchNorm pair folded.

    Folded BatchNorms become ``nn.Identity``; per-channel weight amax follows the fold
    exactly. BatchNorms that cannot be folded stay (and are logged).
    """
    folded = model if inplace else copy.deepcopy(model)
    folded.eval()
    pairs = find_conv_bn_pairs(folded)
    done = 0
    for conv_name, bn_name in pairs:
        conv = folded.get_submodule(conv_name)
        bn = folded.get_submodule(bn_name)
        if fold_conv_bn(conv, bn):
            _set_module(folded, bn_name, nn.Identity())
            done += 1
        else:
            log.info("BatchNorm %s stays unfolded (cannot fold into %s)", bn_name, conv_name)
    left = [n for n, m in folded.named_modules() if isinstance(m, _BatchNorm)]
    if left:
        log.info("%d BatchNorm layer(s) not folded: %s", len(left), ", ".join(left[:5]))
    log.debug("folded %d BatchNorm layers", done)
    return folded

"""What a traced node does, as far as Q/DQ placement cares: weighted layers, BatchNorm,
float-only ops (LayerNorm, Softmax), value-preserving data movement, pooling, upsampling,
concatenation, additions and matrix products."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from trtqat.quant.tensor_quantizer import TensorQuantizer

# modules that return their input in eval mode (dropout, drop path) or only move data
_PASS_MODULES = {"Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                 "FeatureAlphaDropout", "DropPath", "StochasticDepth", "DropBlock2d",
                 "Flatten", "Unflatten", "Permute"}
_PASS_METHODS = {"view", "reshape", "permute", "transpose", "flatten", "unflatten",
                 "contiguous", "squeeze", "unsqueeze", "expand", "expand_as", "view_as",
                 "reshape_as", "chunk", "split", "unbind", "tensor_split", "__getitem__",
                 "clone", "detach", "movedim", "swapaxes", "narrow"}
_PASS_FUNCTIONS = {torch.flatten, torch.reshape, torch.permute, torch.transpose, torch.squeeze,
                   torch.unsqueeze, torch.chunk, torch.split, torch.unbind, torch.tensor_split,
                   torch.clone, torch.movedim, torch.swapaxes, torch.narrow, operator.getitem,
                   F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
                   F.feature_alpha_dropout}
# pointwise activations TensorRT fuses into the conv before them (conv + act + add)
_ACT_MODULES = (nn.ReLU, nn.ReLU6, nn.SiLU, nn.Hardswish, nn.GELU, nn.LeakyReLU, nn.Mish,
                nn.ELU, nn.Hardtanh, nn.PReLU, nn.Sigmoid, nn.Tanh)
_ACT_FUNCTIONS = {F.relu, F.relu6, F.silu, F.hardswish, F.gelu, F.leaky_relu, F.mish, F.elu,
                  F.hardtanh, torch.relu, torch.sigmoid, torch.tanh}
_ACT_METHODS = {"relu", "relu_", "sigmoid", "tanh"}
_NORM_MODULES = (nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", nn.LayerNorm),
                 nn.Softmax, nn.LocalResponseNorm)
_NORM_FUNCTIONS = {F.layer_norm, F.group_norm, F.softmax, torch.softmax, F.log_softmax,
                   getattr(F, "rms_norm", F.layer_norm)}
_MATMUL_FUNCTIONS = {operator.matmul, torch.matmul, torch.bmm}
_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}
_CAT_FUNCTIONS = {torch.cat, torch.concat, torch.concatenate}
_MAXPOOL_NAMES = {"max_pool1d", "max_pool2d", "max_pool3d", "_max_pool1d", "_max_pool2d",
                  "_max_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
                  "max_pool3d_with_indices"}
_SHAPE_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad"}
_SHAPE_METHODS = {"size", "dim", "numel", "nelement", "ndimension", "get_device"}


def _name(target: object) -> str:
    return getattr(target, "__name__", str(target))


def called(flow, ref) -> nn.Module | None:
    """The module a ``call_module`` ref calls (None for other ops)."""
    return flow.module(ref) if ref[1].op == "call_module" else None


def is_weighted(module: nn.Module | None) -> bool:
    """A convolution or a Linear layer (quantized or not)."""
    return isinstance(module, (_ConvNd, nn.Linear))


def is_batchnorm(module: nn.Module | None) -> bool:
    """A BatchNorm, a subclass of one (SyncBatchNorm, timm's BatchNormAct2d), or a frozen
    BatchNorm (its statistics as buffers)."""
    if isinstance(module, _BatchNorm):
        return True
    return module is not None and "BatchNorm" in type(module).__name__ and all(
        isinstance(getattr(module, n, None), torch.Tensor)
        for n in ("running_mean", "running_var", "weight", "bias"))


def is_opaque_layer(module: nn.Module) -> bool:
    """Modules placement treats as one op, never traced: BatchNorm and normalisation layers,
    dropout and drop path (whatever library defines them)."""
    return is_batchnorm(module) or isinstance(module, _NORM_MODULES) or \
        type(module).__name__ in _PASS_MODULES or type(module).__name__ in (
            "LayerNorm2d", "LayerNormAct2d", "RmsNorm", "GroupNormAct")


def is_float_only(flow, ref) -> bool:
    """Ops TensorRT keeps in float: LayerNorm, GroupNorm, RMSNorm, Softmax (and BatchNorm
    not after a conv, which cannot fold)."""
    node = ref[1]
    module = called(flow, ref)
    if module is not None:
        return isinstance(module, _NORM_MODULES) or is_batchnorm(module) or \
            type(module).__name__ in ("LayerNorm2d", "LayerNormAct2d", "RmsNorm")
    if node.op == "call_function":
        return node.target in _NORM_FUNCTIONS or node.target is F.batch_norm
    return node.op == "call_method" and node.target in ("softmax", "log_softmax")


def is_passthrough(flow, ref) -> bool:
    """Ops whose output holds (some of) the input's values unchanged."""
    node = ref[1]
    module = called(flow, ref)
    if module is not None:
        return type(module).__name__ in _PASS_MODULES
    if node.op == "call_method":
        return node.target in _PASS_METHODS
    if node.op == "call_function":
        if node.target is operator.getitem:
            return is_tensor(node.args[0])
        return node.target in _PASS_FUNCTIONS
    return False


def is_activation(flow, ref) -> bool:
    """A pointwise activation (ReLU, SiLU, GELU, ...)."""
    node = ref[1]
    module = called(flow, ref)
    if module is not None:
        return isinstance(module, _ACT_MODULES) or type(module).__name__ in (
            "SiLU", "Swish", "HardSwish", "GELU", "Mish")
    if node.op == "call_function":
        return node.target in _ACT_FUNCTIONS
    return node.op == "call_method" and node.target in _ACT_METHODS


def is_maxpool(flow, ref) -> bool:
    module = called(flow, ref)
    if module is not None:
        return isinstance(module, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d))
    return ref[1].op == "call_function" and _name(ref[1].target) in _MAXPOOL_NAMES


def is_nearest_upsample(flow, ref) -> bool:
    node = ref[1]
    module = called(flow, ref)
    if module is not None:
        return isinstance(module, nn.Upsample) and module.mode == "nearest"
    if node.op == "call_function" and node.target in (F.interpolate, F.upsample):
        return node.kwargs.get("mode", "nearest") == "nearest" and (
            len(node.args) < 4 or node.args[3] == "nearest")
    return False


def is_cat(ref) -> bool:
    node = ref[1]
    return node.op == "call_function" and node.target in _CAT_FUNCTIONS and bool(node.args) \
        and isinstance(node.args[0], (list, tuple))


def is_add(ref) -> bool:
    node = ref[1]
    if node.op == "call_function":
        return node.target in _ADD_FUNCTIONS
    return node.op == "call_method" and node.target in ("add", "add_", "__add__", "__iadd__")


def is_matmul(ref) -> bool:
    node = ref[1]
    if node.op == "call_function":
        return node.target in _MATMUL_FUNCTIONS
    return node.op == "call_method" and node.target in ("matmul", "bmm", "__matmul__")


def is_sdpa(ref) -> bool:
    node = ref[1]
    return node.op == "call_function" and node.target is F.scaled_dot_product_attention


def is_scale_by_constant(node: fx.Node) -> tuple[bool, fx.Node | None]:
    """``x * c`` or ``x / c`` with ``c`` a number or a parameter: (True, x)."""
    mul = node.op == "call_function" and node.target in (operator.mul, torch.mul,
                                                         operator.truediv, torch.div)
    mul = mul or (node.op == "call_method" and node.target in ("mul", "mul_", "div", "div_"))
    if not mul or len(node.args) < 2:
        return False, None
    a, b = node.args[0], node.args[1]
    if is_tensor(a) and is_constant(b):
        return True, a
    if is_tensor(b) and is_constant(a) and node.target not in (operator.truediv, torch.div):
        return True, b
    return False, None


def is_constant(value: object) -> bool:
    """A number, or a node computed from parameters/buffers only (a layer scale)."""
    if not isinstance(value, fx.Node):
        return isinstance(value, (int, float))
    node = value
    for _ in range(16):
        if node.op == "get_attr":
            return True
        if node.op in ("call_method", "call_function") and node.args and \
                isinstance(node.args[0], fx.Node) and node.target in (
                    "view", "reshape", "unsqueeze", "expand", "to", operator.getitem,
                    torch.reshape, torch.unsqueeze):
            node = node.args[0]
            continue
        return False
    return False


def is_tensor(value: object) -> bool:
    """False for values FX traces from shapes and sizes (``x.shape[2] + 1``) and numbers."""
    if not isinstance(value, fx.Node):
        return False
    node = value
    if node.op == "call_function" and node.target is getattr:
        return node.args[1] not in _SHAPE_ATTRS
    if node.op == "call_method" and node.target in _SHAPE_METHODS:
        return False
    if node.op == "call_function" and node.target in (operator.getitem, operator.add,
                                                      operator.sub, operator.mul,
                                                      operator.floordiv, operator.truediv,
                                                      operator.mod, operator.neg):
        inputs = [a for a in node.args if isinstance(a, fx.Node)]
        return any(is_tensor(a) for a in inputs) if inputs else False
    return node.op != "output"


def is_quantizer(module: nn.Module | None) -> bool:
    return isinstance(module, TensorQuantizer)


def input_quantizer(module: nn.Module | None, index: int) -> tuple[nn.Module, str] | None:
    """``(owner, attribute)`` of the quantizer a quantized module applies to its argument
    ``index`` (layers: their input; QuantMatMul: either operand), or None."""
    if module is None:
        return None
    if is_quantizer(module):
        return None
    names = ("_input_quantizer", "_other_quantizer") if hasattr(module, "_other_quantizer") \
        else ("_input_quantizer",)
    if index < len(names) and isinstance(getattr(module, names[index], None), TensorQuantizer):
        return module, names[index]
    return None

"""Which quantized layers TensorRT can run in FP8 E4M3, and the one-line refusal of the rest.

FP8 placement is INT8's (Conv/Gemm/MatMul inputs and weights, residual Adds, attention
matmuls, Concat/MaxPool shared scales): the tensors TensorRT fuses into an FP8 kernel are the
inputs of its GEMM-like layers. What TensorRT 10/11 runs in FP8, from its documentation:

* "Working with Quantized Types" (docs.nvidia.com/deeplearning/tensorrt/latest/
  inference-library/work-quantized-types.html): FP8 E4M3 quantizes activations and weights,
  explicit Q/DQ only, on compute capability 8.9+ (Ada, Hopper, Blackwell); the FP8 math
  layers are the convolutions and matrix multiplies (TensorRT-RTX: matrix multiplies only).
* TensorRT 10.x release notes, "Limitations" (10.12, 10.13): "There are no optimized FP8
  Convolutions for Group Convolutions and Depthwise Convolutions. Therefore, INT8 is still
  recommended for ConvNets containing these"; FP8 convolutions take kernels of at most 32
  elements (a 7x7 falls back to FP16/FP32 kernels). These build (slowly, through fallback
  kernels), so they are not refused: a NOTE line names them (:func:`fp8_fallbacks`).
* TensorRT 10.6 release notes: per-channel scaling for FP8 GEMMs (Hopper); weights keep
  their per-output-channel scales (axis 0) in FP8, as in INT8.

Left float by the fp8 format (:func:`keep_float_in_fp8`, a NOTE line): convolutions with at
most 16 input or output channels (an RGB stem; ModelOpt's threshold, TensorRT issue 3987:
no FP8 kernel beats FP16 there) and average pooling's input quantizer (TensorRT pools in
FP16/FP32, so an FP8 Q/DQ there only adds a rounding): what the export's FP8 lint flags
(``fp8-small-conv``, ``no-fp8-form``). Enable their quantizers to force FP8.

Refused (:data:`NO_FP8`): transposed convolutions (TensorRT has no FP8 deconvolution
kernels) and 3-D convolutions (its FP8 convolution kernels are 2-D; a 1-D convolution runs as
a 2-D one). Recurrent layers are never quantized by trtqat. Not measured on a GPU here.
"""

from __future__ import annotations

import logging
import math

from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.quant.descriptor import E4M3
from trtqat.quant.model_ops import quantizers

log = logging.getLogger(__name__)

SMALL_CONV_CHANNELS = 16  # <= this many input or output channels: the conv stays float
MAX_FP8_KERNEL = 32  # kernel elements of TensorRT's FP8 convolutions (a 7x7 falls back)
# layer class names TensorRT cannot run in FP8, with what they are
NO_FP8: dict[str, str] = {
    "ConvTranspose1d": "transposed convolution", "ConvTranspose2d": "transposed convolution",
    "ConvTranspose3d": "transposed convolution", "Conv3d": "3-D convolution",
}


def _kind(module: nn.Module) -> str | None:
    """What ``module`` is when TensorRT has no FP8 form of it (None: it has one)."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("torch.nn.") and cls.__name__ in NO_FP8:
            return cls.__name__
    return None


def fp8_refused(model: nn.Module) -> list[tuple[str, str]]:
    """``(name, torch.nn class)`` of every layer of ``model`` with an enabled FP8 quantizer
    of its own that TensorRT cannot run in FP8."""
    found = []
    for name, module in model.named_modules():
        kind = _kind(module)
        if kind is None:
            continue
        own = [q for q_name, q in quantizers(module) if "." not in q_name.strip(".")]
        if any(q.num_bits == E4M3 and not q.disabled for q in own):
            found.append((name, kind))
    return found


def fp8_fallbacks(model: nn.Module) -> list[str]:
    """Convolutions with an enabled FP8 quantizer that TensorRT runs through its slower
    fallback kernels: grouped or depthwise, or a kernel of more than 32 elements."""
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Conv2d | nn.Conv1d) or _kind(module) is not None:
            continue
        if not any(q.num_bits == E4M3 and not q.disabled for _, q in quantizers(module)):
            continue
        if module.groups > 1 or math.prod(module.kernel_size) > MAX_FP8_KERNEL:
            found.append(name)
    return found


def check_fp8_layers(model: nn.Module) -> None:
    """A one-line QuantConfigError naming the layers TensorRT cannot run in FP8, and the fix;
    a NOTE line for the convolutions it runs in FP8 only through slower fallback kernels."""
    found = fp8_refused(model)
    if not found:
        slow = fp8_fallbacks(model)
        if slow:
            log.warning("NOTE fp8: TensorRT has no optimized FP8 kernels for %d grouped, "
                        "depthwise or large-kernel convolution(s) (e.g. %s): they run through "
                        "fallback kernels; int8 is TensorRT's advice for such ConvNets",
                        len(slow), ", ".join(slow[:3]))
        return
    names = [name for name, _ in found]
    shown = ", ".join(f"{name} ({kind}: {NO_FP8[kind]})" for name, kind in found[:4])
    more = f" and {len(found) - 4} more" if len(found) > 4 else ""
    raise QuantConfigError(
        f"format fp8: TensorRT has no FP8 kernels for {shown}{more}: keep them float with "
        f"skip_layers={names!r} (trtqat calibrate --skip-layers {','.join(names)}) or use "
        "format int8")


def keep_float_in_fp8(model: nn.Module) -> list[str]:
    """Disable the FP8 quantizers TensorRT would not use in FP8 (see the module doc): those
    of convolutions with <= :data:`SMALL_CONV_CHANNELS` input or output channels, and the
    input quantizer of average pooling; one NOTE line. Returns the layers left float. A model
    whose convolutions are all small keeps them FP8 (nothing would be left to quantize)."""
    from trtqat.quant.model_ops import quantizer_names

    names, _ = quantizer_names(model)
    convs = [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    is_small = [min(m.in_channels, m.out_channels) <= SMALL_CONV_CHANNELS for m in convs]
    toy = all(is_small)  # only small convs (a toy model): FP8 as asked, or nothing would be
    left = []
    for name, module in model.named_modules():
        small = (not toy and isinstance(module, nn.modules.conv._ConvNd)
                 and min(module.in_channels, module.out_channels) <= SMALL_CONV_CHANNELS)
        pool = "AvgPool" in type(module).__name__
        if not (small or pool):
            continue
        own = [getattr(module, a, None) for a in ("_input_quantizer", "_weight_quantizer")]
        # a quantizer shared with another layer (a Concat's scale) stays as it is
        own = [q for q in own if q is not None and not q.disabled and len(names[id(q)]) == 1]
        if own:
            for q in own:
                q.disable()
            left.append(name)
    if left:
        log.warning("NOTE fp8: %d layer(s) stay float, as TensorRT runs them faster in FP16 "
                    "(convolutions with <= %d channels, average pooling): %s",
                    len(left), SMALL_CONV_CHANNELS, ", ".join(left[:4]) +
                    (f" (+{len(left) - 4} more)" if len(left) > 4 else ""))
    return left

"""Vision Transformers (torchvision ``VisionTransformer``): the third model family.

Models: ``vit_tiny`` / ``vit_small`` (and ``vit``, an alias of ``vit_small``), small
configurations that train from scratch on the 8x8 digits upscaled to ``--image-size``, and
torchvision's ``vit_b_16``, ``vit_b_32``, ``vit_l_16``, ``vit_l_32``, ``vit_h_14`` (random
weights, or a ``--weights`` file / cached torchvision weights). The image size is part of
the architecture (the position embedding), so it must be a multiple of the patch size and is
recorded in checkpoints.

Quantization follows TensorRT's transformer placement: Q/DQ on the inputs of every
Linear/MatMul (the patch-embedding ``conv_proj``, the q/k/v/out projections, the MLP, the
head) and on both operands of the two attention matmuls; LayerNorm, Softmax and GELU stay
float. torchvision's ``nn.MultiheadAttention`` computes its projections inside
``F.multi_head_attention_forward``, so :meth:`ViTFamily.quantize` replaces each by a
:class:`ViTSelfAttention` (same weights, same float outputs) whose projections are
ordinary Linear layers and whose attention core is the encoder family's
(:func:`trtqat.quant.plugins.attention.quant_attention_forward` with two ``QuantMatMul``).
Models built for training keep torchvision's module (and keys, ``in_proj_weight``), so
torchvision ``--weights`` load as they are; quantized checkpoints hold
``q_proj``/``k_proj``/``v_proj``, and :meth:`ViTFamily.load` reads both kinds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from trtqat.errors import QuantConfigError, TrtqatError
from trtqat.families.base import EngineHints
from trtqat.families.cnn import CNNFamily, fit_checkpoint_state
from trtqat.families.cnn.family import placement_of
from trtqat.quant.plugins.mha import (  # noqa: F401 (re-exported)
    QKV,
    ViTSelfAttention,
    fuse_qkv_keys,
    replace_attention,
)
from trtqat.runopts import FP32_DEFAULTS
from trtqat.runs.qat_recipe import qat_epochs

# Small configurations: train from scratch on digits (8x8 upscaled) in about a minute on
# two CPU cores at the default --image-size 32 (8x8 patches of 4x4 pixels + a class token).
SMALL_CONFIGS: dict[str, dict[str, int]] = {
    "vit_tiny": {"patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 32,
                 "mlp_dim": 64},
    "vit_small": {"patch_size": 4, "num_layers": 4, "num_heads": 4, "hidden_dim": 64,
                  "mlp_dim": 128},
}
ALIASES = {"vit": "vit_small"}
TORCHVISION_VITS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
SMALL_IMAGE_SIZE = 32        # the CNN default --image-size
QAT_EPOCH_FRACTION = 0.2     # of the FP32 run's epochs
QAT_LR_FRACTION = 0.15       # of the FP32 run's learning rate
TORCHVISION_IMAGE_SIZE = 224


class ViTConfigError(TrtqatError, ValueError):
    """A ViT cannot be built as asked (image size vs patch size, masks, checkpoint)."""








def _square(image_size: Any, default: int) -> int:
    if image_size is None:
        return default
    if isinstance(image_size, (tuple, list)):
        if len(image_size) != 2 or image_size[0] != image_size[1]:
            raise ViTConfigError(f"--image-size {image_size}: a ViT takes square images; "
                                 "pass one size, e.g. --image-size 32")
        image_size = image_size[0]
    return int(image_size)


class ViTFamily(CNNFamily):
    """Vision Transformers: image classifiers with TensorRT's transformer Q/DQ placement."""

    name = "vit"
    task = "classification"
    summary = ("Vision Transformers: vit (= vit_small), vit_tiny, vit_small, or torchvision's "
               "vit_b_16, vit_b_32, vit_l_16, vit_l_32, vit_h_14")

    def claims_model(self, model: str) -> bool:
        """The small configurations, their alias ``vit`` and torchvision's ViT names."""
        return model in SMALL_CONFIGS or model in ALIASES or model in TORCHVISION_VITS

    def claims_checkpoint(self, ckpt: dict[str, Any]) -> bool:
        """Checkpoints tagged ``model.family == "vit"``."""
        return (ckpt.get("model") or {}).get("family") == self.name

    def claims_module(self, model: nn.Module) -> bool:
        """A torchvision ``VisionTransformer``, or a model holding this family's quantizable
        attention (:class:`ViTSelfAttention`)."""
        import torchvision

        return isinstance(model, torchvision.models.VisionTransformer) or any(
            isinstance(m, ViTSelfAttention) for m in model.modules())

    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """A float ViT. Options: ``image_size`` (a multiple of the patch size; default 32 for
        the small configurations, 224 for torchvision's), ``channels`` (default 3),
        ``weights`` (a file or torchvision weights name, see ``model_source.load_weights``)."""
        import torchvision

        arch = ALIASES.get(model, model)
        if not self.claims_model(model):
            raise ViTConfigError(f"unknown ViT {model!r}: use one of "
                                 f"{', '.join([*ALIASES, *SMALL_CONFIGS, *TORCHVISION_VITS])}")
        if num_classes is not None and num_classes < 2:
            raise ViTConfigError(f"--num-classes must be >= 2, got {num_classes}")
        small = arch in SMALL_CONFIGS
        size = _square(options.get("image_size"),
                       SMALL_IMAGE_SIZE if small else TORCHVISION_IMAGE_SIZE)
        patch = SMALL_CONFIGS[arch]["patch_size"] if small else int(arch.rsplit("_", 1)[1])
        if size < patch or size % patch:
            fit = max(patch, round(size / patch) * patch)
            raise ViTConfigError(f"--image-size {size} is not a multiple of {model}'s patch "
                                 f"size {patch}: use --image-size {fit}")
        classes = num_classes or (10 if small else 1000)
        if small:
            net = torchvision.models.VisionTransformer(image_size=size, num_classes=classes,
                                                       **SMALL_CONFIGS[arch])
        else:
            net = torchvision.models.get_model(arch, weights=None, image_size=size,
                                               num_classes=classes)
        # torchvision zeroes the head, which leaves an untrained ViT nothing to quantize there
        net.heads.head.reset_parameters()
        channels = int(options.get("channels") or 3)
        if channels != 3:
            old = net.conv_proj
            net.conv_proj = nn.Conv2d(channels, old.out_channels, old.kernel_size, old.stride)
        if options.get("weights"):
            from trtqat.families.cnn.model_source import load_weights

            load_weights(net, arch, str(options["weights"]), new_head=num_classes is not None)
        return net

    def arch(self, model: str) -> str:
        """The configuration name a checkpoint records (``vit`` is ``vit_small``)."""
        return ALIASES.get(model, model)

    def origin(self, model: str) -> dict[str, Any]:
        """Checkpoint ``model.source``: the configuration, built by this family."""
        return {"model": self.arch(model), "kind": self.name}

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = (),
                 placement: str | None = None) -> nn.Module:
        """In place: attention modules made quantizable (:class:`ViTSelfAttention`), then
        TensorRT's Q/DQ placement (``trtqat.quant.placement``: every Conv/Linear input,
        weights per channel, both operands of the attention matmuls); activations
        histogram-calibrated. ``skip_layers`` globs keep matching layers (or whole
        attention modules, e.g. ``*.encoder_layer_0.*``) in float."""
        from trtqat.families.cnn.models import QUANT_DESC_INPUT, quantize_classifier
        from trtqat.quant.plugins.matmul import QuantMatMul

        replace_attention(model)
        attention = [m for m in model.modules() if isinstance(m, ViTSelfAttention)]
        if not attention:
            raise QuantConfigError(f"{type(model).__name__} has no multi-head attention for "
                                   "the ViT family to quantize: quantize it as a CNN instead")
        for m in attention:
            if not isinstance(getattr(m, "matmul_qk", None), QuantMatMul):
                m.matmul_qk = QuantMatMul(QUANT_DESC_INPUT)
            if not isinstance(getattr(m, "matmul_av", None), QuantMatMul):
                m.matmul_av = QuantMatMul(QUANT_DESC_INPUT)
        quantize_classifier(model, skip_layers, placement)
        return model

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The ViT a checkpoint describes (arch, num_classes, image_size, channels), with its
        weights; ``quantized=True`` on a float checkpoint: an uncalibrated quantized copy.

        Float models come back with :class:`ViTSelfAttention` too (same outputs), so FP32,
        FP16 and INT8 exports share one attention graph (ONNX Runtime 1.2x crashed building
        the FP16 graph of ``nn.MultiheadAttention`` at its highest optimisation level)."""
        from trtqat.families.cnn.model_source import is_quantizer_key
        from trtqat.families.quant_format import apply_spec_format

        spec = ckpt["model"]
        holds_quant = bool(spec.get("quantized"))
        quantized = holds_quant if quantized is None else quantized
        channels = (spec.get("preprocess") or {}).get("channels")
        model = self.build(spec["arch"], int(spec["num_classes"]),
                           image_size=spec.get("image_size"), channels=channels)
        skip = tuple(spec.get("skip_layers") or ())
        state = dict(ckpt["state_dict"])
        if holds_quant and quantized:
            apply_spec_format(self.quantize(model, skip, placement=placement_of(spec)), spec)
            _fit(model, state, spec)
            return model
        # torchvision's keys (q/k/v fused back when the file holds split projections)
        _fit(model, {k: v for k, v in fuse_qkv_keys(state).items() if not is_quantizer_key(k)},
             spec)
        if quantized:
            return apply_spec_format(self.quantize(model, skip), spec)
        replace_attention(model)
        return model

    def recipe(self, stage: str, cfg: Any, source: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """train: AdamW at 2e-3 (weight decay 0.05), 30 epochs of 64 (transformers trained
        from scratch diverge with the CNN's SGD at 0.05); calibrate: mse (entropy clips the
        softmax probabilities); qat: 20% of the FP32 run's epochs from 15% of its learning
        rate (6 epochs from 3e-4 after the default FP32 run). The CNN rule (10% from 1%)
        barely moves an AdamW-trained ViT: on digits, seeds 0-5, it scored below PTQ."""
        if stage == "train":
            return {"opt": "adamw", "lr": 2e-3, "weight_decay": 0.05, "epochs": 30,
                    "batch_size": 64}
        if stage == "calibrate":
            return {"method": "mse"}
        if stage == "qat" and cfg is not None:
            recorded = dict((source or {}).get("train_args") or {})  # the FP32 run's options
            fp32 = {**FP32_DEFAULTS, **self.recipe("train", None),
                    **{k: v for k, v in recorded.items() if v is not None}}
            cfg = copy.copy(cfg)  # the CNN rule then fills the rest from these two
            cfg.epochs = cfg.epochs or qat_epochs(fp32["epochs"], QAT_EPOCH_FRACTION)
            cfg.lr = cfg.lr or QAT_LR_FRACTION * fp32["lr"]
            source = {**(source or {}), "train_args": fp32}
        return super().recipe(stage, cfg, source)

    def engine_hints(self) -> EngineHints:
        """ORT CPU: fold the exporter's scale subgraphs, then fuse each quantized MatMul with
        its scale Mul and bias Add (``MatMulIntegerToFloat``, uint8 activations), so the
        attention matmuls run on integer kernels; no BatchNorm, pooling or output-quantizer
        passes. FP16 variants keep LayerNorm and Softmax in float32 (TensorRT's transformer
        guidance: their reductions overflow or lose precision in fp16)."""
        return EngineHints(
            ort_rewrites=("fold_constants", "prequantize_weights", "unify_quantizers",
                          "reencode_uint8", "quantize_gemm_bias", "fuse_matmul_epilogues"),
            fp16_sensitive_ops=("LayerNormalization", "Softmax"))


def _fit(model: nn.Module, state: dict[str, torch.Tensor], spec: dict[str, Any]) -> None:
    fit_checkpoint_state(model, state, spec, "architecture or --image-size")




__all__ = ["ALIASES", "SMALL_CONFIGS", "TORCHVISION_VITS", "ViTConfigError", "ViTFamily",
           "ViTSelfAttention", "fuse_qkv_keys", "replace_attention"]

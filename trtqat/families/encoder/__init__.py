"""Transformers: quantized attention for Hugging Face BERT-family encoders, PTQ and QAT.

``import trtqat.families.encoder`` works without the ``transformers`` package; the functions
that need it raise a one-line error with the install hint (``trtqat[transformers]``).
"""

from trtqat.families.encoder.checkpoint import (
    build_encoder_from_checkpoint,
    encoder_spec,
    is_encoder_checkpoint,
    load_encoder_checkpoint,
    save_encoder_checkpoint,
)
from trtqat.families.encoder.corpus import Corpus, load_corpus
from trtqat.families.encoder.export import (
    encoder_dynamic_axes,
    encoder_input_names,
    encoder_shapes,
    example_inputs_for_encoder,
)
from trtqat.families.encoder.family import EncoderFamily
from trtqat.families.encoder.metrics import embedding_fidelity, mean_cosine, similarity_spearman
from trtqat.families.encoder.minilm import (
    MINILM,
    SentenceEncoder,
    embed,
    load_encoder,
    load_tokenizer,
    model_dir,
    tokenize,
)
from trtqat.families.encoder.recipes import (
    CalibOptions,
    EncoderCalibConfig,
    EncoderQATConfig,
    calibrate_encoder,
    calibrated_copy,
    collect_encoder_stats,
    qat_encoder,
    quantized_copy,
    set_amax,
)
from trtqat.quant.plugins.attention import (
    ATTN_IMPLEMENTATION,
    quantize_attention,
    register_attention,
)
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.plugins.transformer import quantize_transformer

_LAZY = {"export_encoder": "trtqat.families.encoder.onnx_export",
         "EncoderExporter": "trtqat.families.encoder.onnx_export"}


def __getattr__(name: str):
    """``export_encoder`` and ``EncoderExporter``, imported on first use (they need onnx)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EncoderExporter", "EncoderFamily", "export_encoder",
    "ATTN_IMPLEMENTATION", "MINILM", "CalibOptions", "Corpus", "EncoderCalibConfig",
    "EncoderQATConfig", "QuantMatMul", "SentenceEncoder", "build_encoder_from_checkpoint",
    "calibrate_encoder", "calibrated_copy",
    "collect_encoder_stats", "embed", "embedding_fidelity", "encoder_dynamic_axes",
    "encoder_input_names", "encoder_shapes", "encoder_spec", "example_inputs_for_encoder",
    "is_encoder_checkpoint", "load_corpus", "load_encoder", "load_encoder_checkpoint",
    "load_tokenizer", "mean_cosine", "model_dir", "qat_encoder", "quantize_attention",
    "quantize_transformer", "quantized_copy", "register_attention", "save_encoder_checkpoint",
    "set_amax", "similarity_spearman", "tokenize",
]

"""BERT-style sentence encoders (MiniLM, Hugging Face folders): self-distilled, cosine-checked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trtqat.families.base import ExportInputs, ModelFamily, StageData, StageResult
from trtqat.families.types import EvalData, FamilyExport, Variant

if TYPE_CHECKING:
    from trtqat.export.checks import CheckContext
    from trtqat.export.onnx_export import ExportPlan
    from trtqat.export.validate import Check
    from trtqat.families.base import StageConfig
    from trtqat.stages.calibrate import CalibrateConfig
    from trtqat.stages.compare.run import CompareConfig
    from trtqat.stages.export import ExportOptions
    from trtqat.stages.qat import QATConfig


class EncoderFamily(ModelFamily):
    """Sentence encoders: mean-pooled embeddings, checked by cosine against FP32."""

    name = "encoder"
    checkpoint_tag = "transformer"  # the tag every encoder checkpoint carries
    task = "embedding"
    summary = "sentence encoders: 'minilm' or a Hugging Face BERT-family folder"

    def claims_model(self, model: str) -> bool:
        """``minilm`` or a Hugging Face model folder (one holding ``config.json``)."""
        from trtqat.families.encoder.minilm import MINILM
        from trtqat.families.model_paths import probe

        if model == MINILM:
            return True
        return bool(model) and probe(model) == "dir" and probe(
            Path(model).expanduser() / "config.json") == "file"

    def claims_module(self, model: nn.Module) -> bool:
        """A :class:`~trtqat.families.encoder.minilm.SentenceEncoder`, a Hugging Face
        encoder (``BertModel``, ``DistilBertModel``, ``RobertaModel``, ``ViTModel``, ...:
        not a decoder), or any module whose ``forward`` takes ``input_ids`` first."""
        from trtqat.families.encoder.hf_models import takes_token_ids
        from trtqat.families.encoder.minilm import SentenceEncoder

        return isinstance(model, SentenceEncoder) or takes_token_ids(model)

    def claims_onnx(self, input_names: Sequence[str]) -> bool:
        """Token ids in: a sentence encoder's file (trtqat.families.encoder.export names them)."""
        return "input_ids" in input_names

    def build(self, model: str, num_classes: int | None = None, **options: Any) -> nn.Module:
        """The FP32 encoder ``model`` names (its tokenizer: ``load_encoder``)."""
        from trtqat.families.encoder.minilm import load_encoder

        return load_encoder(model)[0]

    def load(self, ckpt: dict[str, Any], quantized: bool | None = None) -> nn.Module:
        """The encoder of a checkpoint, with its weights."""
        from trtqat.families.encoder.checkpoint import build_encoder_from_checkpoint

        return build_encoder_from_checkpoint(ckpt, quantized)[0]

    def quantize(self, model: nn.Module, skip_layers: Sequence[str] = ()) -> nn.Module:
        """Linear layers and the attention matmuls, in place."""
        from trtqat.quant.plugins.transformer import quantize_transformer

        return quantize_transformer(model, skip_layers=tuple(skip_layers))

    # ---- data and recipe ----------------------------------------------------------------
    def data(self, cfg: StageConfig, split: str, **context: Any) -> StageData:
        """Sentences of ``context["data"]`` (``builtin`` or a text file, one a line): the
        training split (calibration or distillation) and the held-out one (fidelity). The
        split is the same in every stage. ``info``: ``corpus`` and the checked ``data``."""
        from trtqat.families.encoder.runs import corpus_of

        data, corpus = corpus_of(context.get("data"))
        return StageData(corpus.train, corpus.heldout, None, {"corpus": corpus, "data": data})

    def recipe(self, stage: str, cfg: StageConfig | None, source: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """calibrate: mse, 32 sentences a batch, 128 tokens; qat: self-distillation
        ("distill") from the FP32 teacher, AdamW, 3 epochs at 1e-4 (cosine to 1%)."""
        from trtqat.families.encoder.runs import calibrate_recipe, qat_recipe

        if stage == "train":
            return {}  # encoders are not trained from scratch: run_train refuses them
        if stage == "calibrate":
            return calibrate_recipe(cfg)
        return qat_recipe(cfg, source or {"model": {}})

    # ---- stages -------------------------------------------------------------------------
    def run_calibrate(self, cfg: CalibrateConfig, source: dict[str, Any] | None) -> StageResult:
        """PTQ on the corpus; also writes the FP32 reference run beside ``cfg.out``."""
        from trtqat.families.encoder.runs import calibrate_encoder_run

        return calibrate_encoder_run(cfg, self, source)

    def run_qat(self, cfg: QATConfig, source: dict[str, Any]) -> StageResult:
        """QAT by self-distillation from the FP32 reference of the calibration."""
        from trtqat.families.encoder.runs import qat_encoder_run

        return qat_encoder_run(cfg, self, source)

    def describe(self, stage: str, result: StageResult) -> str:
        """``STAGE: held-out mean cosine vs FP32 ..., Spearman ...; run folder OUT``."""
        from trtqat.families.encoder.runs import describe

        return describe(stage, result)

    # ---- export, compare, sensitivity ---------------------------------------------------
    def metric(self, outputs: Any, targets: Any) -> dict[str, float]:
        """Embedding fidelity against the FP32 embeddings ``targets``: mean and min cosine,
        Spearman of the pairwise similarities, sentence count."""
        from trtqat.families.encoder.metrics import embedding_fidelity

        return embedding_fidelity(targets, outputs)

    def export_inputs(self, model: nn.Module, spec: dict[str, Any], batch: int | None
                      ) -> ExportInputs:
        """Two tokenized sentences of ``spec["max_length"]`` tokens (default 16); batch and
        sequence dynamic whatever ``batch`` (a size-1 dimension would be specialised)."""
        from trtqat.families.encoder.export import OUTPUT_NAMES, encoder_dynamic_axes
        from trtqat.families.encoder.export import example_inputs_for_encoder as example
        from trtqat.families.encoder.minilm import load_tokenizer

        inputs = example(load_tokenizer(spec["arch"]), 2, int(spec.get("max_length") or 16))
        return ExportInputs(tuple(inputs.values()), list(inputs), list(OUTPUT_NAMES),
                            encoder_dynamic_axes(list(inputs)))

    def export_check(self, variant: str, reference: Sequence[Any], candidate: Sequence[Any],
                     context: CheckContext | None = None) -> list[Check]:
        """The cosine of ONNX Runtime's embeddings with PyTorch's, mean and worst sentence."""
        from trtqat.export.checks import embedding_checks

        return embedding_checks(variant, reference, candidate, context)

    def export_plan(self, model: nn.Module, ckpt: dict[str, Any], options: ExportOptions
                    ) -> FamilyExport:
        """Batch and sequence dynamic, validated on sentences at two shapes."""
        from trtqat.families.encoder.onnx_export import encoder_export

        return encoder_export(self, model, ckpt, options)

    def module_plan(self, model: nn.Module, example_inputs: Any, **options: Any) -> ExportPlan:
        """The tokenizer's output as example (batch and sequence dynamic), validated on it
        and on a smaller batch of shorter sequences, by embedding cosine."""
        from trtqat.families.encoder.onnx_export import module_plan

        return module_plan(model, example_inputs, checks=self.export_check, **options)

    def compare_data(self, variants: Sequence[Variant], settings: dict[str, Any],
                     cfg: CompareConfig) -> EvalData:
        """Held-out sentences, their FP32 embeddings, training sentences to calibrate ORT."""
        from trtqat.families.encoder.compare_data import sentence_data

        return sentence_data(self, variants, settings, cfg)

"""An in-memory Hugging Face encoder is the encoder family: dynamic batch and sequence,
its own output names, a cosine check at export and at engine build (issue 34)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import trtqat
from trtqat import families
from trtqat.cli import main

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 100, "max_position_embeddings": 64}


def _distilbert():
    torch.manual_seed(0)
    return transformers.DistilBertModel(transformers.DistilBertConfig(
        dim=32, n_layers=2, n_heads=2, hidden_dim=64, **TINY)).eval()


def _tokens(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length // 2:] = 0  # a padded row
    return {"input_ids": torch.randint(5, 100, (batch, length), generator=g),
            "attention_mask": mask}


class _TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 8)

    def forward(self, input_ids, attention_mask):
        return self.emb(input_ids) * attention_mask.unsqueeze(-1)


@pytest.mark.parametrize("build, encoder", [
    (lambda: transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        **TINY)), True),
    (lambda: transformers.RobertaModel(transformers.RobertaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        **TINY)), True),
    (lambda: transformers.ViTModel(transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64)), True),
    (_TokenModel, True),
    (lambda: transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=1, n_head=2)), False),  # a decoder
    (lambda: nn.Sequential(nn.Linear(4, 4)), False),
])
def test_the_family_of_a_module_is_what_it_is(build, encoder):
    assert (families.of_module(build()).name == "encoder") is encoder


def test_a_distilbert_from_a_config_exports_as_an_encoder(tmp_path):
    model = _distilbert()
    enc = _tokens(2, 32)
    trtqat.quantize(model, forward_loop=lambda m: m(**enc))
    result = trtqat.export_onnx(model, enc, tmp_path / "distil.onnx", "int8")
    assert result.passed and set(result.dynamic_axes) == {"batch", "sequence"}
    cosine = [c for c in result.checks if c.name.startswith("output 'last_hidden_state'")]
    assert cosine and "cosine mean" in cosine[0].detail

    proto = onnx.load(str(result.path))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["trtqat.family"] == "encoder" and meta["trtqat.task"] == "feature-extraction"
    assert [o.name for o in proto.graph.output] == ["last_hidden_state"]
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    with torch.no_grad():  # two other batch sizes and sequence lengths than the example
        for batch, length in ((1, 7), (3, 20)):
            feed = _tokens(batch, length, seed=length)
            got = session.run(None, {k: v.numpy() for k, v in feed.items()})[0]
            want = model(**feed).last_hidden_state.numpy()
            keep = feed["attention_mask"].numpy().astype(bool)
            assert got.shape == (batch, length, 32)
            np.testing.assert_allclose(got[keep], want[keep], atol=1e-3)

    feeds = [{k: v.numpy() for k, v in _tokens(2, n, seed=n).items()} for n in (9, 17)]
    engine = trtqat.build_engine(result.path, "ort", calib_feeds=feeds)
    built = {p.key: p.value for p in onnx.load_from_string(engine.payload).metadata_props}
    agreement = json.loads(built["trtqat.cpu_reencode"])["agreement"]
    assert agreement["metric"] == "cosine" and agreement["mean_cosine"] > 0.98


def test_a_model_folder_without_a_tokenizer_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "distil"
    _distilbert().save_pretrained(folder)
    capsys.readouterr()  # transformers' progress bar
    rc = main(["calibrate", "--model", str(folder), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc != 0 and "holds no tokenizer" in err and "save_pretrained" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_decoder_folder_is_refused_before_anything_is_loaded(tmp_path, capsys):
    """A GPT-2 folder was asked for a tokenizer, then failed on its attention, naming
    trtqat's SentenceEncoder: now one line naming the folder's model and that it decodes."""
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))  # no weights needed
    rc = main(["calibrate", "--model", str(folder), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and not (tmp_path / "run").exists()
    assert "holds a gpt2 model (GPT2LMHeadModel), a decoder: trtqat takes encoders" in err[0]


def test_a_distilbert_folder_goes_through_calibrate_and_export(tmp_path, capsys):
    from tiny_bert import SPECIALS

    folder = tmp_path / "distil"
    _distilbert().save_pretrained(folder)
    words = "the a model runs quantized matrix products in eight bit integers".split()
    vocab = {t: i for i, t in enumerate([*SPECIALS, ".", *words])}
    transformers.DistilBertTokenizer(vocab=vocab).save_pretrained(folder)
    run, out = tmp_path / "ptq", tmp_path / "onnx"
    assert main(["calibrate", "--model", str(folder), "--method", "max", "--num-sentences",
                 "8", "--max-length", "16", "--batch-size", "8", "--no-progress",
                 "--out", str(run)]) == 0
    assert main(["export", "-c", str(run), "--variant", "int8", "--max-length", "12",
                 "--out", str(out)]) == 0
    assert "cosine mean" in capsys.readouterr().out
    proto = onnx.load(str(next(out.glob("*-int8.onnx"))))
    assert {p.key: p.value for p in proto.metadata_props}["trtqat.family"] == "encoder"
    dims = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim]
            for i in proto.graph.input}
    assert dims == {"input_ids": ["batch", "sequence"],
                    "attention_mask": ["batch", "sequence"]}  # no token_type_ids


def test_the_token_check_leaves_padding_out_but_not_its_nans():
    from trtqat.export.checks import CheckContext
    from trtqat.families.encoder.hf_export import token_checks

    ids, mask = torch.ones(2, 4, dtype=torch.long), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    ref = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32)
    context = CheckContext(names=["last_hidden_state"], batches=[(ids, mask)])

    def check(got):
        return token_checks("int8", [[ref]], [[got]], context, mask_index=1)[0]

    padded = ref.copy()
    padded[1, 2:] = -padded[1, 2:]  # padding tokens: whatever the model computes there
    assert check(ref).passed and check(padded).passed and "6 rows" in check(padded).detail
    broken = ref.copy()
    broken[0, 1] = -broken[0, 1]  # a real token
    assert not check(broken).passed
    padded[1, 3, 0] = np.nan
    assert not check(padded).passed and "non-finite" in check(padded).detail


def test_a_sequence_past_robertas_positions_is_refused_before_export(tmp_path):
    from trtqat.export import ExportError

    torch.manual_seed(0)
    model = transformers.RobertaModel(transformers.RobertaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        **TINY)).eval()  # positions count from padding_idx + 1: 62 tokens at most
    with pytest.raises(ExportError, match="exceeds the encoder's 62 positions"):
        trtqat.export_onnx(model, _tokens(2, 63), tmp_path / "r.onnx", "fp32")
    assert not (tmp_path / "r.onnx").exists()

"""``trtqat compare`` on sentence encoders: a tiny random BERT's fp32/ptq/qat runs."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
import torch
from tiny_bert import save_tiny_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="needs trtqat[transformers]")

WORDS = ("the quick brown fox jumps over lazy dog return a new list containing every item of "
         "sequence quantized model runs its matrix products in eight bit integers").split()
ALL = ("fp32", "fp16", "ptq-max", "qat-int8", "qat-int8-fp16")
# Each dynamo export takes seconds: two variants (float and int8) keep this file fast; the
# export of every variant is tested in tests/families/encoder.
VARIANTS = ("fp32", "qat-int8")


def _tiny_bert(folder: Path) -> Path:
    return save_tiny_bert(folder, WORDS)


def _sentences(path: Path, n: int = 60) -> Path:
    rng = random.Random(1)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
                              .capitalize() + "." for _ in range(n)) + "\n")
    return path


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    """fp32/, ptq-max/ and qat/ runs of the tiny encoder (through the library verbs, which
    route the encoder to its family)."""
    from trtqat.stages.calibrate import CalibrateConfig, calibrate
    from trtqat.stages.qat import QATConfig, qat_finetune

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("enc")
    model = _tiny_bert(base / "tiny-bert")
    text = _sentences(base / "sentences.txt")
    root = base / "runs"
    try:
        calibrate(CalibrateConfig(
            model=str(model), data=str(text), method="max", num_sentences=16, max_length=24,
            batch_size=8, out=str(root / "ptq-max"), progress=False))
        qat_finetune(QATConfig(checkpoint=str(root / "ptq-max" / "best.pt"),
                               out=str(root / "qat"), max_steps=2, batch_size=8,
                               progress=False))
    finally:
        torch.set_num_threads(n)
    return root


@pytest.fixture(scope="module")
def report(run_root, tmp_path_factory) -> tuple[dict, str, Path]:
    import contextlib
    import io

    from trtqat.cli import main

    out = tmp_path_factory.mktemp("cmp")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            rc = main(["compare", "--run", str(run_root), "--batch-sizes", "1,2",
                       "--max-length", "16", "--duration", "0.05", "--warmup", "5",
                       "--threads", "1", "--variants", ",".join(VARIANTS),
                       "--export-dir", str(out / "export"),
                       "--out", str(out / "engines")])
    finally:
        torch.set_num_threads(n)
    assert rc == 0, buf.getvalue()
    return json.loads((out / "engines" / "report.json").read_text()), buf.getvalue(), out


def test_every_encoder_variant_is_measured(report):
    rep, _, _ = report
    assert rep["metric"] == "mean_cosine" and not rep["partial"] and rep["failed"] == []
    got = {v["name"]: v for v in rep["variants"]}
    assert tuple(got) == VARIANTS
    for v in got.values():
        m = v["metrics"]
        assert v["status"] == "ok", v["error"]
        assert m["sentences"] == 6  # 60 lines -> 6 held-out
        assert "agree_fp32" not in m and v["onnx_mib"] > 0  # no top-1 of embeddings
        assert m["mean_cosine"] is not None and 0.5 < m["mean_cosine"] <= 1.0 + 1e-6
        assert m["spearman"] is not None and -1.0 <= m["spearman"] <= 1.0 + 1e-9
        for b in ("1", "2"):
            assert math.isfinite(v["latency_ms"][b]) and v["latency_ms"][b] > 0
            assert math.isfinite(v["throughput"][b]) and v["throughput"][b] > 0
        assert Path(v["onnx"]).is_file() and Path(v["engine"]).is_file()
    # the FP32 engine reproduces the FP32 PyTorch embeddings; int8 ones lose a little
    assert got["fp32"]["metrics"]["mean_cosine"] > 0.99999
    assert got["fp32"]["metrics"]["spearman"] > 0.9999
    assert got["qat-int8"]["metrics"]["mean_cosine"] < got["fp32"]["metrics"]["mean_cosine"]
    assert Path(got["fp32"]["onnx"]).name == "tiny_bert-fp32.onnx"  # the export rule
    assert Path(got["qat-int8"]["onnx"]).name == "tiny_bert-qat-int8.onnx"
    assert got["qat-int8"]["nodes"]["integer"] > 0  # ORT runs the MatMuls in integers


def test_engine_fidelity_matches_the_qat_run(report, run_root):
    from trtqat.runs.run_dir import read_metrics

    rep, _, _ = report
    engine = next(v for v in rep["variants"] if v["name"] == "qat-int8")["metrics"]
    torch_run = read_metrics(run_root / "qat")[-1]  # same held-out sentences, in PyTorch
    assert engine["sentences"] == torch_run["sentences"]
    assert engine["mean_cosine"] == pytest.approx(torch_run["mean_cosine"], abs=1e-3)
    assert rep["dataset"]["max_length"] == 16 and rep["dataset"]["heldout_sentences"] == 6


def test_discovery_finds_every_encoder_variant(run_root):
    from trtqat.stages.compare.variants import discover

    variants, settings = discover(run_root)
    assert tuple(v.name for v in variants) == ALL
    assert {v.family for v in variants} == {"encoder"} and settings["family"] == "encoder"
    assert [v.precision for v in variants][-1] == "int8-fp16"
    assert {v.arch for v in variants} == {"tiny-bert"}
    assert settings["data"].endswith("sentences.txt")


def test_table_and_markdown_show_fidelity(report):
    rep, stdout, out = report
    assert "cosine vs fp32" in stdout and "Spearman" in stdout and "sent/s@2" in stdout
    assert "top1" not in stdout
    md = (out / "engines" / "report.md").read_text()
    assert "| qat-int8 |" in md and "cosine vs fp32" in md
    assert (out / "engines" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explicit_encoder_onnx_and_bad_seq_len(report, run_root, tmp_path):
    from trtqat.stages.compare.run import CompareConfig, compare
    from trtqat.stages.compare.variants import CompareError, explicit

    rep, _, _ = report
    fp32_onnx = next(v["onnx"] for v in rep["variants"] if v["name"] == "fp32")
    assert explicit([fp32_onnx])[0].family == "encoder"
    # an encoder ONNX alone: the reference encoder comes from the file's metadata
    alone = compare(CompareConfig(onnx=(fp32_onnx,), data=str(run_root.parent / "sentences.txt"),
                                  max_length=16, batch_sizes=(1, 2), duration_s=0.05, warmup_ms=5,
                                  threads=1, out=str(tmp_path / "alone")), echo=lambda _: None)
    (v,) = alone["variants"]
    assert v["status"] == "ok" and v["metrics"]["mean_cosine"] > 0.99999
    assert alone["dataset"]["reference"].startswith("pretrained:")
    with pytest.raises(CompareError, match="exceeds the encoder's 64 positions"):
        compare(CompareConfig(run=str(run_root), max_length=100, out=str(tmp_path / "e"),
                              export_dir=str(tmp_path / "x")), echo=lambda _: None)
    assert not (tmp_path / "e" / "report.json").exists()

"""``trtqat export`` of an encoder checkpoint: files, per-check lines, export.json, errors."""

from __future__ import annotations

import json

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tiny_bert import calibrated_encoder  # noqa: E402

from trtqat.cli import main  # noqa: E402
from trtqat.export import artifact_name  # noqa: E402
from trtqat.families.encoder.checkpoint import encoder_spec, save_encoder_checkpoint  # noqa: E402


def test_int8_export_of_an_encoder_checkpoint(tiny, tiny_dir, sentences, tmp_path, capsys):
    model, tok = tiny
    q = calibrated_encoder(model, tok, sentences, max_length=32)
    ckpt = save_encoder_checkpoint(tmp_path / "run" / "best.pt", q, stage="ptq",
                                   spec=encoder_spec(arch=tiny_dir, quantized=True,
                                                     max_length=32))
    out = tmp_path / "export"
    rc = main(["export", "--checkpoint", str(ckpt.parent), "--variant", "int8",
               "--out", str(out), "--seq-len", "24"])
    text = capsys.readouterr().out
    assert rc == 0, text
    name = artifact_name(tiny_dir.name, "ptq-max", "int8")  # no calib record: max
    assert sorted(p.name for p in out.iterdir()) == ["export.json", name]
    assert "dynamic batch and sequence" in text
    assert "PASS  output 'sentence_embedding' vs PyTorch fake-quant: cosine" in text
    assert "2x24, 3x9" in text and "PASS  TensorRT Q/DQ lint: 0 error(s)" in text
    summary = json.loads((out / "export.json").read_text())
    assert summary["family"] == "transformer" and summary["max_length"] == 24
    result = summary["results"][0]
    assert result["written"] and result["passed"] and result["variant"] == "int8"
    meta = {p.key: p.value for p in onnx.load(out / name).metadata_props}
    assert meta["trtqat.arch"] == tiny_dir.name and meta["trtqat.stage"] == "ptq"


def test_int8_of_an_fp32_encoder_checkpoint_is_refused(tiny, tiny_dir, tmp_path, capsys):
    model, _ = tiny
    ckpt = save_encoder_checkpoint(tmp_path / "fp32.pt", model, stage="fp32",
                                   spec=encoder_spec(arch=tiny_dir))
    out = tmp_path / "export"
    assert main(["export", "--checkpoint", str(ckpt), "--variant", "int8",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "without quantizer state" in err and "--variant fp32/fp16" in err
    assert not out.exists() or not list(out.glob("*.onnx"))
    assert main(["export", "--checkpoint", str(ckpt), "--variant", "fp32", "--image-size",
                 "32", "--out", str(out)]) == 1
    assert "--image-size is for CNN checkpoints only" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(ckpt), "--variant", "fp32", "--max-length",
                 "100", "--out", str(out)]) == 1
    assert "--max-length 100 is out of range" in capsys.readouterr().err
    assert not out.exists() or not list(out.glob("*.onnx"))


def test_sensitivity_asks_the_family_and_refuses_an_encoder(tiny, tiny_dir, sentences,
                                                            tmp_path, capsys):
    model, tok = tiny
    q = calibrated_encoder(model, tok, sentences, max_length=32)
    ckpt = save_encoder_checkpoint(tmp_path / "best.pt", q, stage="ptq",
                                   spec=encoder_spec(arch=tiny_dir, quantized=True))
    assert main(["sensitivity", "--checkpoint", str(ckpt), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "does not analyse encoder models" in err and "CNN calibrate/qat run" in err

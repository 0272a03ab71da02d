"""``trtqat export``: files, lines, and one-line errors."""

from __future__ import annotations

import json

import onnx
import pytest
from export_testlib import make_tiny

from trtqat.cli import main
from trtqat.families.cnn import CNNFamily
from trtqat.runs.checkpoint import load_checkpoint, save_checkpoint


def test_int8_export_of_a_ptq_checkpoint(resnet18_int8):
    out = resnet18_int8.parent
    assert [p.name for p in out.glob("*.onnx")] == ["resnet18-ptq-max-int8.onnx"]
    assert not list(out.glob(".*"))  # no temporary files left
    model = onnx.load(resnet18_int8)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]] == [3, 16, 16]
    summary = json.loads((out / "export.json").read_text())
    assert summary["results"][0]["written"] and summary["results"][0]["variant"] == "int8"


def test_validated_export_of_every_variant(tmp_path, monkeypatch, capsys):
    """The tiny model stands in for a torchvision one, so every check runs quickly."""

    monkeypatch.setattr(CNNFamily, "load", lambda self, ckpt, *_: make_tiny())
    spec = {"arch": "tiny", "num_classes": 10, "image_size": 16, "quantized": True,
            "skip_layers": []}
    ckpt = save_checkpoint(tmp_path / "qat" / "best.pt",
                           {"stage": "qat", "model": spec, "state_dict": {}})
    out = tmp_path / "export"
    rc = main(["export", "--checkpoint", str(ckpt), "--out", str(out), "--data", "synthetic"])
    text = capsys.readouterr().out
    assert rc == 0, text
    names = sorted(p.name for p in out.glob("*.onnx"))
    assert names == ["tiny-qat-fp16.onnx", "tiny-qat-fp32.onnx", "tiny-qat-int8-fp16.onnx",
                     "tiny-qat-int8.onnx"]
    assert "FAIL" not in text
    assert text.count("PASS  top-1 agreement 'output': 100.00%: 0 of 256 samples disagree") >= 3
    assert "PASS  TensorRT Q/DQ lint" in text
    for name in names:  # compare finds the family of a file by its metadata
        meta = {p.key: p.value for p in onnx.load(str(out / name)).metadata_props}
        assert meta["trtqat.family"] == "cnn", name


def _fp32_checkpoint(tmp_path):
    from trtqat.families.cnn.models import build_model

    spec = {"arch": "resnet18", "num_classes": 10, "image_size": 16, "quantized": False,
            "skip_layers": []}
    state = build_model("resnet18", 10).state_dict()
    return save_checkpoint(tmp_path / "fp32" / "best.pt",
                           {"stage": "fp32", "model": spec, "state_dict": state})


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("trtqat export: error:") and "\n" not in err
    return err


def test_int8_from_fp32_checkpoint_says_calibrate_first(tmp_path, capsys):
    ckpt = _fp32_checkpoint(tmp_path)
    rc = main(["export", "--checkpoint", str(ckpt), "--variant", "int8", "--out",
               str(tmp_path / "out")])
    assert rc == 1
    assert "run `trtqat calibrate` (PTQ) or `trtqat qat` first" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_unwritable_output_folder(tmp_path, capsys, resnet18_ptq_checkpoint):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as info:  # refused by the --out validator, before any work
        main(["export", "--checkpoint", str(resnet18_ptq_checkpoint), "--variant", "int8",
              "--out", str(blocker / "export"), "--no-validate"])
    assert info.value.code == 1
    assert "which is a file, not a folder" in _one_line_error(capsys)


def test_checkpoint_with_an_uncalibrated_quantizer(tmp_path, capsys, resnet18_ptq_checkpoint):
    ckpt = load_checkpoint(resnet18_ptq_checkpoint)
    del ckpt["state_dict"]["layer2.0.conv1._input_quantizer._amax"]
    ckpt.pop("format")
    path = save_checkpoint(tmp_path / "partial.pt", ckpt)
    rc = main(["export", "--checkpoint", str(path), "--variant", "int8", "--out",
               str(tmp_path / "out"), "--no-validate"])
    assert rc == 1
    err = _one_line_error(capsys)
    assert "'layer2.0.conv1._input_quantizer' is not calibrated" in err
    assert not list((tmp_path / "out").glob("*.onnx"))


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--variant", "int3"]])
def test_bad_arguments_are_refused(argv, resnet18_ptq_checkpoint):
    with pytest.raises(SystemExit) as info:
        main(["export", "--checkpoint", str(resnet18_ptq_checkpoint), *argv])
    assert info.value.code == (1 if argv[0] == "--batch" else 2)  # bad value: 1, bad choice: 2


def test_fixed_batch_name(tmp_path, monkeypatch):

    monkeypatch.setattr(CNNFamily, "load", lambda self, ckpt, *_: make_tiny())
    spec = {"arch": "tiny", "num_classes": 10, "image_size": 16, "quantized": True}
    ckpt = save_checkpoint(tmp_path / "best.pt", {"stage": "ptq", "model": spec,
                                                  "state_dict": {}})
    assert main(["export", "--checkpoint", str(ckpt), "--variant", "fp32", "--batch", "4",
                 "--out", str(tmp_path / "o"), "--no-validate"]) == 0
    model = onnx.load(tmp_path / "o" / "tiny-ptq-max-fp32-b4.onnx")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4

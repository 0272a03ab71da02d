"""--model from a file factory, torchvision or timm; --weights files and their errors."""

from __future__ import annotations

import pytest
import torch
from byom_testlib import make_float, write_model

from trtqat.errors import TrtqatError
from trtqat.families import build_from_checkpoint
from trtqat.families.cnn import model_source as ms
from trtqat.stages.calibrate import CalibrateConfig, calibrate


@pytest.fixture
def model_file(tmp_path):
    return write_model(tmp_path)


def test_file_factory_builds_float_and_quantized(model_file):
    source = f"{model_file}:make"
    assert ms.kind_of(source) == "file"
    assert ms.arch_name(source) == "my_net.make"
    model = ms.build(source, num_classes=5)
    assert model[-1].out_features == 5
    quant = ms.build(source, num_classes=5, quantized=True)
    assert type(quant[0]).__name__ == "QuantConv2d"
    assert ms.describe(source)["file_sha256"] == ms.sha256(model_file)


@pytest.mark.parametrize("suffix, match", [
    (":missing", "has no function 'missing'; it defines make, gray, not_a_model, broken"),
    (":not_a_model", "returned a int, not a torch.nn.Module"),
    (":broken", "raised RuntimeError: no GPU here"),
    ("", "name the factory function too"),
])
def test_factory_errors_name_file_and_function(model_file, suffix, match):
    with pytest.raises(TrtqatError, match=match):
        ms.build(f"{model_file}{suffix}", 10)


def test_missing_or_broken_model_file(tmp_path):
    with pytest.raises(TrtqatError, match="model file .*nope.py does not exist"):
        ms.build(f"{tmp_path / 'nope.py'}:make", 10)
    bad = tmp_path / "bad.py"
    bad.write_text("import not_a_module_anywhere\n")
    with pytest.raises(TrtqatError, match="importing model file .*bad.py failed: "
                       "ModuleNotFoundError"):
        ms.build(f"{bad}:make", 10)


def test_unknown_name_suggests_sources():
    with pytest.raises(TrtqatError, match="resnet18.*file.py:factory"):
        ms.kind_of("resnet1")


@pytest.mark.parametrize("wrap", ["plain", "checkpoint", "ddp"])
def test_weights_plain_checkpoint_and_ddp_prefix(model_file, tmp_path, wrap):
    ref = make_float(model_file)
    state = ref.state_dict()
    payload = {"plain": state, "checkpoint": {"epoch": 3, "model": {"state_dict": state}},
               "ddp": {f"module.{k}": v for k, v in state.items()}}[wrap]
    torch.save(payload, tmp_path / "w.pt")
    model = ms.build(f"{model_file}:make", 10)
    info = ms.load_weights(model, f"{model_file}:make", str(tmp_path / "w.pt"))
    assert torch.equal(model[0].weight, ref[0].weight)
    assert info["weights_sha256"] == ms.sha256(tmp_path / "w.pt")


def test_weights_that_do_not_fit_list_keys(model_file, tmp_path):
    state = make_float(model_file).state_dict()
    state["extra.weight"] = torch.zeros(1)
    del state["0.bias"]
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(TrtqatError, match=r"missing 0.bias; unexpected extra.weight"):
        ms.load_weights(ms.build(f"{model_file}:make", 10), "x", str(tmp_path / "w.pt"))
    torch.save(make_float(model_file, num_classes=3).state_dict(), tmp_path / "w3.pt")
    with pytest.raises(TrtqatError, match=r"shape .*7.weight \(3, 8\) vs \(10, 8\).*--num-classes"):
        ms.load_weights(ms.build(f"{model_file}:make", 10), "x", str(tmp_path / "w3.pt"))
    torch.save(torch.nn.Linear(4, 2).state_dict(), tmp_path / "other.pt")  # another model
    with pytest.raises(TrtqatError, match=r"unexpected weight, bias \(weights of another "
                       r"model\? --weights takes the float weights of --model\)$"):
        ms.load_weights(ms.build(f"{model_file}:make", 10), "x", str(tmp_path / "other.pt"))


def test_weights_file_errors(model_file, tmp_path):
    model = ms.build(f"{model_file}:make", 10)
    with pytest.raises(TrtqatError, match="--weights .*nope.pt: no such file"):
        ms.load_weights(model, f"{model_file}:make", str(tmp_path / "nope.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(TrtqatError, match="cannot read weights .*junk.pt"):
        ms.load_weights(model, f"{model_file}:make", str(tmp_path / "junk.pt"))
    torch.save(make_float(model_file), tmp_path / "pickled.pt")
    with pytest.raises(TrtqatError, match="pickled.pt: it holds pickled Python objects, which trtqat does not load .*: save a plain state_dict"):
        ms.load_weights(model, f"{model_file}:make", str(tmp_path / "pickled.pt"))


def test_torchvision_named_weights_come_from_the_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    with pytest.raises(TrtqatError, match=r"not in the local cache \(.*hub.*resnet18-f37072fd"
                       r"\.pth\): trtqat never downloads"):
        ms.resolve_weights("resnet18", "IMAGENET1K_V1")
    cached = tmp_path / "hub" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    assert ms.resolve_weights("resnet18", "ResNet18_Weights.DEFAULT") == cached


def test_timm_names_resolve_to_the_architecture():
    timm = pytest.importorskip("timm", reason="timm is optional: pip install 'trtqat[timm]'")
    assert timm is not None
    assert ms.kind_of("resnet50.a1_in1k") == "timm"
    assert ms.kind_of("timm:resnet18") == "timm"
    assert ms.arch_name("timm:resnet18") == "resnet18"
    model = ms.build("timm:resnet18", num_classes=3, quantized=True)
    assert type(model.conv1).__name__ == "QuantConv2d"
    assert model.fc.out_features == 3


def test_calibrate_records_the_source_and_rebuilds_from_the_checkpoint(model_file, tmp_path):
    torch.save(make_float(model_file).state_dict(), tmp_path / "w.pt")
    out = tmp_path / "ptq"
    calibrate(CalibrateConfig(model=f"{model_file}:make", weights=str(tmp_path / "w.pt"),
                              data="synthetic", image_size="16x12", batch_size=4,
                              num_batches=1, limit_batches=1, out=str(out), progress=False,
                              device="cpu"))
    ckpt = torch.load(out / "best.pt", weights_only=True)
    spec = ckpt["model"]
    assert spec["arch"] == "my_net.make" and spec["num_classes"] == 10
    assert spec["source"]["weights_sha256"] == ms.sha256(tmp_path / "w.pt")
    assert spec["source"]["file"] == str(model_file.resolve())
    assert spec["preprocess"]["size"] == [16, 12] and spec["image_size"] == (16, 12)
    model = build_from_checkpoint(ckpt)
    assert all(q.amax is not None for _, q in model.named_modules()
               if type(q).__name__ == "TensorQuantizer")
    model_file.unlink()
    with pytest.raises(TrtqatError, match="my_net.py does not exist"):
        build_from_checkpoint(ckpt)


def test_fine_tuning_keeps_a_new_head_random(model_file, tmp_path, caplog):
    ref = make_float(model_file, num_classes=3)
    torch.save(ref.state_dict(), tmp_path / "w3.pt")
    model = ms.build(f"{model_file}:make", 5)
    ms.load_weights(model, "x", str(tmp_path / "w3.pt"), new_head=True)
    assert torch.equal(model[0].weight, ref[0].weight)
    assert model[-1].out_features == 5
    assert "7.bias, 7.weight has another class count" in caplog.text

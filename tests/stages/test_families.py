"""The stage commands find the model family once and let it run the stage.

Routing through the CLI (the family's stage hooks are stubbed), the family tag new
checkpoints carry, untagged (older) checkpoints, and a family subclass that changes only
``build`` going through every training stage unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trtqat import families
from trtqat.cli import main
from trtqat.families import build_from_checkpoint
from trtqat.families.cnn import CNNFamily
from trtqat.families.encoder import EncoderFamily
from trtqat.families.encoder.checkpoint import encoder_spec
from trtqat.quant.model_ops import quantizers
from trtqat.runs.checkpoint import load_checkpoint, save_checkpoint
from trtqat.stages.calibrate import CalibrateConfig
from trtqat.stages.qat import QATConfig, qat_finetune
from trtqat.stages.train import TrainConfig

CNN_SPEC = {"arch": "resnet18", "num_classes": 10, "image_size": 16, "quantized": False,
            "skip_layers": []}  # as every checkpoint before model families: no "family"


@pytest.fixture
def routed(monkeypatch) -> list[tuple[str, str, bool]]:
    """Stub every stage hook: each call records (family, hook, whether a checkpoint came)."""
    seen: list[tuple[str, str, bool]] = []

    def hook(name):
        def run(self, cfg, *source):
            seen.append((self.name, name, bool(source and source[0])))
            return {"out": cfg.out}
        return run

    for cls in (CNNFamily, EncoderFamily):
        for name in ("run_calibrate", "run_qat"):
            monkeypatch.setattr(cls, name, hook(name))
        monkeypatch.setattr(cls, "describe", lambda self, stage, result: f"{stage}: stub")
    monkeypatch.setattr(CNNFamily, "run_train", hook("run_train"))
    return seen


@pytest.fixture
def checkpoints(tmp_path) -> dict[str, Path]:
    """An untagged CNN checkpoint (fp32 and ptq) and encoder ones (fp32 and ptq)."""
    paths = {}
    for stage in ("fp32", "ptq"):
        paths[f"cnn-{stage}"] = save_checkpoint(
            tmp_path / f"cnn-{stage}.pt",
            {"stage": stage, "model": {**CNN_SPEC, "quantized": stage == "ptq"},
             "state_dict": {}})
        paths[f"encoder-{stage}"] = save_checkpoint(
            tmp_path / f"enc-{stage}.pt",
            {"stage": stage, "model": encoder_spec("minilm", quantized=stage == "ptq"),
             "state_dict": {}})
    return paths


def test_cli_routes_by_model_name_folder_or_file(routed, tmp_path, capsys):
    folder = tmp_path / "my-bert"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # a Hugging Face folder
    out = ["--out", str(tmp_path / "out")]
    cases = [(["--model", "minilm"], "encoder"),
             (["--model", str(folder)], "encoder"),
             (["--model", "resnet18"], "cnn"),
             (["--model", str(tmp_path / "nets" / "my_net.py:make")], "cnn")]
    for argv, family in cases:
        assert main(["calibrate", *argv, *out]) == 0
        assert routed.pop() == (family, "run_calibrate", False), argv
    assert "calibrate: stub" in capsys.readouterr().err
    assert main(["train", "--model", "resnet18", *out]) == 0
    assert routed.pop() == ("cnn", "run_train", False)


def test_cli_routes_by_checkpoint(routed, checkpoints, tmp_path):
    out = ["--out", str(tmp_path / "out")]
    for kind in ("cnn", "encoder"):
        assert main(["calibrate", "-c", str(checkpoints[f"{kind}-fp32"]), *out]) == 0
        assert routed.pop() == (kind, "run_calibrate", True)
        assert main(["qat", "-c", str(checkpoints[f"{kind}-ptq"]), *out]) == 0
        assert routed.pop() == (kind, "run_qat", True)


def test_families_resolve_without_the_cli(checkpoints, tmp_path):
    assert families.of_model("minilm").name == "encoder"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert families.of_model(str(tmp_path / "hf")).name == "encoder"  # Hugging Face folder
    assert families.of_model("mobilenet_v2").name == "cnn"
    assert families.of_model("models/net.py:make").name == "cnn"
    family, ckpt = families.of_source(str(checkpoints["encoder-ptq"]))
    assert family.name == "encoder" and ckpt["stage"] == "ptq"
    family, ckpt = families.of_source(None, "resnet18")
    assert family.name == "cnn" and ckpt is None


def test_encoders_are_not_trained_and_a_missing_source_is_one_line(tmp_path, capsys):
    assert main(["train", "--model", "minilm", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not trained by trtqat train" in err and "calibrate" in err
    assert main(["calibrate", "--out", str(tmp_path / "o")]) == 1
    assert "--checkpoint is required" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_stages_record_the_family_and_untagged_checkpoints_still_load(fp32_run, ptq_run,
                                                                         tmp_path):
    for run in (fp32_run, ptq_run):
        assert load_checkpoint(run / "best.pt")["model"]["family"] == "cnn"
    # a checkpoint written before model families has no tag: it is an image classifier
    old = load_checkpoint(ptq_run / "best.pt")
    del old["model"]["family"]
    untagged = save_checkpoint(tmp_path / "old" / "best.pt", old)
    assert families.of_checkpoint(load_checkpoint(untagged)).name == "cnn"
    model = build_from_checkpoint(load_checkpoint(untagged))
    assert all(q.amax is not None for _, q in quantizers(model) if not q.disabled)
    result = qat_finetune(QATConfig(checkpoint=str(untagged), out=str(tmp_path / "qat"),
                                    epochs=1, limit_batches=2, progress=False, device="cpu"))
    assert load_checkpoint(tmp_path / "qat" / "best.pt")["model"]["family"] == "cnn"
    assert result["summary"].startswith("qat: best val top-1 ")


class TinyFamily(CNNFamily):
    """An image-classifier family that changes only the model (as ViTFamily does)."""

    name = "tiny-test"

    def build(self, model: str, num_classes: int | None = None, **options) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))

    def arch(self, model: str) -> str:
        return "tiny"

    def origin(self, model: str) -> dict:
        return {"model": model, "kind": "test"}


def test_a_family_subclass_runs_every_stage_through_its_own_build(tmp_path):
    family = TinyFamily()
    opts = {"data": "synthetic", "image_size": 16, "batch_size": 8, "limit_batches": 2,
            "progress": False, "device": "cpu"}
    family.run_train(TrainConfig(model="tiny", epochs=1, warmup_epochs=0.0,
                                 out=str(tmp_path / "fp32"), **opts))
    fp32 = load_checkpoint(tmp_path / "fp32" / "best.pt")
    assert fp32["model"]["family"] == "tiny-test" and fp32["model"]["arch"] == "tiny"
    family.run_calibrate(CalibrateConfig(checkpoint=str(tmp_path / "fp32" / "best.pt"),
                                         out=str(tmp_path / "ptq"), num_batches=2, **opts),
                         fp32)
    ptq = load_checkpoint(tmp_path / "ptq" / "best.pt")
    assert ptq["model"]["family"] == "tiny-test" and ptq["calib"]["method"] == "max"  # default
    model = family.load(ptq)
    assert isinstance(model[0], nn.Conv2d) and any(True for _ in quantizers(model))
    assert torch.isfinite(model(torch.randn(2, 3, 16, 16))).all()

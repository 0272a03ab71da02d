"""FP32 training, PTQ calibration and QAT on tiny runs: files complete, reloadable, resumable."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from trtqat.families import build_from_checkpoint
from trtqat.families.cnn import CNNFamily
from trtqat.families.cnn.models import build_model
from trtqat.families.types import StageResult
from trtqat.quant.model_ops import quantizers
from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.loop import NonFiniteLossError
from trtqat.runs.recipes import ConfigError
from trtqat.runs.run_dir import RunDirError, read_metrics
from trtqat.stages.export import ExportOptions, ExportRun, export_checkpoint
from trtqat.stages.qat import QATConfig, qat_finetune
from trtqat.stages.train import TrainConfig, train_fp32

RECORD_KEYS = {"stage", "epoch", "train_loss", "train_top1", "train_top5", "val_loss",
               "val_top1", "val_top5", "lr", "images_per_s", "wall_time_s"}


def _raw(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_train_writes_a_complete_reloadable_run(fp32_run):
    names = {p.name for p in fp32_run.iterdir()}
    assert {"args.yaml", "metrics.jsonl", "last.pt", "best.pt"} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    args = yaml.safe_load((fp32_run / "args.yaml").read_text())
    assert set(TrainConfig.__dataclass_fields__) <= set(args)
    assert args["num_classes"] == 10 and args["epochs"] == 2
    records = read_metrics(fp32_run)
    assert [r["epoch"] for r in records] == [1, 2]
    assert all(RECORD_KEYS <= set(r) and r["stage"] == "fp32" for r in records)
    assert records[-1]["val_loss"] < records[0]["val_loss"]  # it learns
    assert records[1]["lr"] < records[0]["lr"]  # cosine
    ckpt = _raw(fp32_run / "last.pt")  # plain weights_only load
    assert {"format", "stage", "model", "state_dict", "optimizer", "scheduler", "epoch", "rng",
            "args"} <= set(ckpt)
    assert ckpt["epoch"] == 2 and ckpt["model"]["arch"] == "resnet18"
    model = build_from_checkpoint(load_checkpoint(fp32_run / "best.pt")).eval()
    out = model(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_resume_continues_exactly_where_it_stopped(fp32_run, tmp_path, fp32_opts):
    out = tmp_path / "run"
    train_fp32(TrainConfig(out=str(out), stop_after=1, **fp32_opts))
    assert _raw(out / "last.pt")["epoch"] == 1
    assert len(read_metrics(out)) == 1
    train_fp32(TrainConfig(out=str(out), resume=True, **fp32_opts))
    a, b = _raw(fp32_run / "last.pt"), _raw(out / "last.pt")
    assert b["epoch"] == 2
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]
    ra, rb = read_metrics(fp32_run), read_metrics(out)
    assert [r["train_loss"] for r in ra] == [r["train_loss"] for r in rb]
    assert [r["val_top1"] for r in ra] == [r["val_top1"] for r in rb]


def test_resume_refuses_changed_options_and_fresh_runs_refuse_to_clobber(fp32_run, tmp_path,
                                                                          fp32_opts):
    copy = tmp_path / "copy"
    shutil.copytree(fp32_run, copy, copy_function=shutil.copyfile)
    before = (copy / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="--lr"):
        train_fp32(TrainConfig(out=str(copy), resume=True, **{**fp32_opts, "lr": 0.5}))
    with pytest.raises(RunDirError, match="already holds a run"):
        train_fp32(TrainConfig(out=str(copy), **fp32_opts))
    with pytest.raises(RunDirError, match="nothing to resume"):
        train_fp32(TrainConfig(out=str(tmp_path / "none"), resume=True, **fp32_opts))
    assert (copy / "metrics.jsonl").read_text() == before
    assert not (tmp_path / "none").exists()


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch,
                                                                   fp32_opts):
    calls = {"n": 0}

    def poisoned(self, name, num_classes=None, **_):
        model = build_model(name, num_classes)

        def hook(module, inputs, output):
            if module.training:
                calls["n"] += 1
                if calls["n"] > 3:  # the first training step of epoch 2
                    return output * float("nan")
            return output

        model.fc.register_forward_hook(hook)
        return model

    monkeypatch.setattr(CNNFamily, "build", poisoned)  # the family builds every model
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match="nan.*epoch 2.*last finite checkpoint is kept: .*last.pt"):
        train_fp32(TrainConfig(out=str(out), **fp32_opts))
    assert _raw(out / "last.pt")["epoch"] == 1
    assert [r["epoch"] for r in read_metrics(out)] == [1]


def test_calibrate_writes_amax_and_the_recipe(ptq_run, fp32_run):
    ckpt = load_checkpoint(ptq_run / "best.pt")
    assert ckpt["stage"] == "ptq" and ckpt["model"]["quantized"] is True
    assert ckpt["calib"]["method"] == "entropy" and ckpt["calib"]["num_batches"] == 2
    assert ckpt["train_args"]["epochs"] == 2 and ckpt["train_args"]["lr"] == 0.01
    args = yaml.safe_load((ptq_run / "args.yaml").read_text())
    assert args["data"] == "synthetic" and args["image_size"] == 16  # from the FP32 run
    model = build_from_checkpoint(ckpt).eval()
    qs = dict(quantizers(model))
    assert any("residual_quantizer" in n for n in qs)
    assert all(q.amax is not None and bool((q.amax > 0).all()) for q in qs.values())
    assert torch.isfinite(model(torch.randn(2, 3, 16, 16))).all()
    [record] = read_metrics(ptq_run)
    assert record["stage"] == "ptq" and 0 <= record["val_top1"] <= 100


def test_qat_derives_its_schedule_from_the_fp32_run(ptq_run, tmp_path):
    out = tmp_path / "qat"
    result = qat_finetune(QATConfig(checkpoint=str(ptq_run / "best.pt"), out=str(out),
                                    limit_batches=3, progress=False, device="cpu"))
    args = yaml.safe_load((out / "args.yaml").read_text())
    assert args["epochs"] == 1  # ceil(10% of 2), at least 1
    assert args["lr"] == pytest.approx(1e-4) and args["min_lr"] == pytest.approx(1e-6)
    records = read_metrics(out)
    assert [r["epoch"] for r in records] == [0, 1]
    assert records[0]["val_top1"] == pytest.approx(read_metrics(ptq_run)[0]["val_top1"])
    assert math.isfinite(records[1]["train_loss"])
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt["stage"] == "qat" and ckpt["calib"]["method"] == "entropy"
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-6)
    before = dict(quantizers(build_from_checkpoint(load_checkpoint(ptq_run / "best.pt"))))
    after = dict(quantizers(build_from_checkpoint(ckpt)))
    for name, q in after.items():
        if before[name].amax is not None:
            assert torch.equal(q.amax, before[name].amax), name
    assert isinstance(result, StageResult) and result.stage == "qat" and result.out == str(out)
    assert result.last == records[-1] and result.best == max(r["val_top1"] for r in records[1:])
    assert result.before == pytest.approx(records[0]["val_top1"])
    assert result.summary == f"qat: best val top-1 {result.best:.2f}%; run folder {out}"
    # the dict of earlier versions, read-only
    assert result["best_top1"] == result.best and result["start_top1"] == result.before
    assert result["last"] is result.last and dict(result)["summary"] == result.summary


def test_export_checkpoint_returns_what_it_wrote(ptq_run, tmp_path):
    run = export_checkpoint(ExportOptions(checkpoint=str(ptq_run / "best.pt"), variant="fp32",
                                          out=str(tmp_path / "onnx"), val_batches=1),
                            echo=lambda _: None)
    assert isinstance(run, ExportRun) and run.family == "cnn" and run.out == tmp_path / "onnx"
    assert [r.variant for r in run.results] == ["fp32"] and all(r.passed for r in run.results)
    assert run.files == [tmp_path / "onnx" / "resnet18-ptq-entropy-fp32.onnx"]
    assert run.files[0].is_file()
    assert json.loads(run.summary_file.read_text())["results"][0]["written"] is True


def test_qat_resume(ptq_run, tmp_path):
    out = tmp_path / "qat"
    cfg = {"checkpoint": str(ptq_run), "out": str(out), "epochs": 2, "limit_batches": 2,
           "progress": False, "device": "cpu"}
    qat_finetune(QATConfig(stop_after=1, **cfg))
    assert [r["epoch"] for r in read_metrics(out)] == [0, 1]
    qat_finetune(QATConfig(resume=True, **cfg))
    assert [r["epoch"] for r in read_metrics(out)] == [0, 1, 2]
    assert load_checkpoint(out / "last.pt")["epoch"] == 2


def test_configs_check_their_options():
    with pytest.raises(ConfigError, match="--epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ConfigError, match="--opt"):
        TrainConfig(opt="lion")
    with pytest.raises(ConfigError, match="--resume and --overwrite"):
        TrainConfig(resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="--checkpoint"):
        QATConfig()
    from trtqat.stages.calibrate import CalibrateConfig

    with pytest.raises(ConfigError, match="--method"):
        CalibrateConfig(checkpoint="x.pt", method="kl")
    with pytest.raises(ConfigError, match="--percentile"):
        CalibrateConfig(checkpoint="x.pt", percentile=0)


def test_mobilenet_v2_trains_with_its_own_recipe_unless_told_otherwise():
    """trtqat/families/cnn/train_recipes.py: lr 0.02 and weight decay 4e-5 for MobileNetV2,
    the shared defaults for the rest; the command line wins; QAT derives from them."""
    from types import SimpleNamespace

    mobile = TrainConfig(model="mobilenet_v2")
    assert (mobile.lr, mobile.weight_decay, mobile.opt) == (0.02, 4e-5, "sgd")
    told = TrainConfig(model="mobilenet_v2", lr=0.1, weight_decay=1e-4)
    assert (told.lr, told.weight_decay) == (0.1, 1e-4)
    other = TrainConfig(model="resnet18")
    assert (other.lr, other.weight_decay) == (0.05, 5e-4)
    qat = CNNFamily().recipe("qat", SimpleNamespace(
        model="mobilenet_v2", epochs=None, lr=None, min_lr=None, momentum=None,
        weight_decay=None, opt=None, label_smoothing=None, data=None, image_size=None,
        batch_size=None), {"train_args": {}})
    assert qat["fp32_lr"] == 0.02 and qat["weight_decay"] == 4e-5

"""Layer sensitivity: a deliberately fragile layer is found, suggested, and skipping it helps."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch import nn

from trtqat.cli import main
from trtqat.families import build_from_checkpoint
from trtqat.families.cnn.data import make_datasets
from trtqat.quant import QuantConfig, QuantDescriptor, collect_stats, compute_amax
from trtqat.quant.model_ops import (
    disable_layers,
    quantize,  # layers only: the units these tests rank
)
from trtqat.runs.checkpoint import load_checkpoint, save_checkpoint
from trtqat.stages.sensitivity_report import suggest
from trtqat.stages.sensitivity_sweep import (
    CachedRunner,
    PlainRunner,
    SensitivityConfig,
    SensitivityError,
    layer_units,
    make_runner,
    rank,
    run_sweep,
)

MAX = QuantDescriptor(num_bits=8)  # max calibration: one pass


class Tiny(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        y = self.relu(self.conv2(x))
        x = self.relu(self.conv3(y)) + y
        return self.fc(torch.flatten(self.pool(x), 1))


def _tensors(ds) -> tuple[torch.Tensor, torch.Tensor]:
    return ds.tensors[0], ds.tensors[1]


@pytest.fixture(scope="module")
def fragile():
    """A trained, calibrated tiny CNN whose conv2 quantizers got a 1000x outlier range."""
    torch.manual_seed(0)
    train, val, _ = make_datasets("synthetic", 8, seed=0, num_classes=4)
    xt, yt = _tensors(train)
    xv, yv = _tensors(val)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        for i in range(0, len(yt), 64):
            loss = nn.functional.cross_entropy(model(xt[i:i + 64]), yt[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    quantize(model, QuantConfig(quant_desc_input=MAX))
    collect_stats(model, [xt[i:i + 64] for i in range(0, 256, 64)], progress=False)
    compute_amax(model, "max")
    for q in (model.conv2._input_quantizer, model.conv2._weight_quantizer):
        q.amax = q.amax * 1000.0  # as if calibrated on a huge outlier: everything rounds to 0
    batches = [(xv[i:i + 64], yv[i:i + 64]) for i in range(0, 256, 64)]
    return model, batches


def _sweep(model, batches, mode, cache=True, metric="top1"):
    units = layer_units(model)
    runner = make_runner(model, units, cache)
    baselines, per_layer = run_sweep(runner, units, mode, batches, progress=False)
    return runner, units, baselines, rank(per_layer, units, baselines, mode, metric)


@pytest.mark.parametrize("mode", ["one-on", "one-off"])
def test_fragile_layer_ranks_first(fragile, mode):
    model, batches = fragile
    runner, units, baselines, rows = _sweep(model, batches, mode)
    assert isinstance(runner, CachedRunner)
    assert list(units) == ["conv1", "conv2", "conv3", "pool", "fc"]
    assert baselines["fp32"]["top1"] > 90 and baselines["quantized"]["top1"] < 50
    assert rows[0]["layer"] == "conv2" and rows[0]["effect"] > 40
    assert rows[0]["quantizers"] == ["conv2._input_quantizer", "conv2._weight_quantizer"]
    assert all(abs(r["effect"]) < 5 for r in rows[1:])
    # quantizer states are back as loaded: all enabled
    assert all(not q.disabled for qs in units.values() for q in qs)


@pytest.mark.parametrize("mode", ["one-on", "one-off"])
def test_cached_path_equals_plain_path(fragile, mode):
    model, batches = fragile
    _, _, base_c, rows_c = _sweep(model, batches, mode, metric="output-mse")
    runner, _, base_p, rows_p = _sweep(model, batches, mode, cache=False, metric="output-mse")
    assert isinstance(runner, PlainRunner)
    assert [r["layer"] for r in rows_c] == [r["layer"] for r in rows_p]
    for a, b in zip(rows_c, rows_p):
        for key in ("top1", "loss", "output_mse"):
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), (a, b)
    for k in ("fp32", "quantized"):
        assert base_c[k] == pytest.approx(base_p[k])


def test_cached_equals_plain_on_resnet_blocks(ptq_run):
    model = build_from_checkpoint(load_checkpoint(ptq_run / "best.pt")).eval()
    units = layer_units(model)
    # (layer1.0's residual quantizer shares the stem MaxPool's scale: one unit with conv1's)
    assert "layer1.1.residual_quantizer" in units and "layer1.0.conv1" in units
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 3]))]
    cached, plain = CachedRunner(model, units), PlainRunner(model, units)
    for mode in ("one-on", "one-off"):
        _, a = run_sweep(cached, units, mode, batches, progress=False)
        _, b = run_sweep(plain, units, mode, batches, progress=False)
        for layer in units:
            assert a[layer]["output_mse"] == pytest.approx(b[layer]["output_mse"], rel=1e-4,
                                                           abs=1e-7), layer


def test_untraceable_model_falls_back(fragile, caplog):
    class Branchy(Tiny):
        def forward(self, x):
            return super().forward(x) if x.sum() > -1e9 else x  # data-dependent branch

    model, batches = fragile
    other = Branchy()
    other.load_state_dict(model.state_dict(), strict=False)
    quantize(other, QuantConfig(quant_desc_input=MAX))
    other.load_state_dict(model.state_dict())
    with caplog.at_level(logging.WARNING):
        runner, _, _, rows = _sweep(other, batches, "one-on")
    assert isinstance(runner, PlainRunner) and "full forward passes" in caplog.text
    assert rows[0]["layer"] == "conv2"


def test_suggest_picks_the_fragile_layer_and_skipping_restores(fragile):
    from trtqat.runs.loop import evaluate

    model, batches = fragile
    runner, units, baselines, rows = _sweep(model, batches, "one-off")
    info = {"checkpoint": "runs/ptq/best.pt", "skip_layers": ["fc"],
            "fp32_checkpoint": "runs/fp32/best.pt"}
    s = suggest(runner, units, batches, rows, SensitivityConfig(checkpoint="x", suggest=1),
                info)
    assert s["layers"] == ["conv2"] and s["skip_layers"] == ["fc", "conv2"]
    assert s["metrics"]["top1"] > baselines["fp32"]["top1"] - 5
    assert s["commands"][0].startswith("trtqat calibrate --checkpoint runs/fp32/best.pt "
                                       "--skip-layers fc,conv2")
    assert "trtqat qat --checkpoint runs/ptq/best.pt --skip-layers fc,conv2" in s["commands"][1]
    assert "trtqat export --checkpoint runs/ptq/best.pt --skip-layers fc,conv2" in s["commands"][2]
    # the honest check: the real model with conv2 left in float
    before = evaluate(model, batches, progress=False)["top1"]
    import copy

    fixed = copy.deepcopy(model)
    assert disable_layers(fixed, ["conv2"]) == ["conv2"]
    after = evaluate(fixed, batches, progress=False)["top1"]
    assert before < 50 and after > baselines["fp32"]["top1"] - 5
    assert after == pytest.approx(s["metrics"]["top1"])


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "both"}, "--mode"), ({"metric": "top5"}, "--metric"),
    ({"batches": 0}, "--batches"), ({"suggest": -1}, "--suggest"), ({"checkpoint": ""}, "required"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(SensitivityError, match=match):
        SensitivityConfig(**{"checkpoint": "x.pt", **kwargs})


def _fragile_checkpoint(ptq_run, tmp_path, layer: str):
    ckpt = load_checkpoint(ptq_run / "best.pt")
    for q in ("_input_quantizer", "_weight_quantizer"):
        ckpt["state_dict"][f"{layer}.{q}._amax"] *= 1000.0
    path = tmp_path / "run" / "best.pt"
    save_checkpoint(path, ckpt)
    return path


def test_cli_writes_json_png_and_suggests(ptq_run, tmp_path, capsys):
    path = _fragile_checkpoint(ptq_run, tmp_path, "layer2.0.conv1")
    assert main(["sensitivity", "-c", str(path), "--batches", "2", "--metric", "output-mse",
                 "--suggest", "1", "--top", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "run" / "sensitivity"  # default: next to the checkpoint
    report = json.loads((folder / "sensitivity.json").read_text())
    assert (folder / "sensitivity.png").stat().st_size > 1000
    assert report["rows"][0]["layer"] == "layer2.0.conv1"
    assert report["engine"] == "cached" and report["config"]["mode"] == "one-on"
    assert report["suggestion"]["layers"] == ["layer2.0.conv1"]
    assert "fp32" in report["baselines"] and "quantized" in report["baselines"]
    assert "1     layer2.0.conv1" in out and "layers x 16 images" in out
    assert "--skip-layers layer2.0.conv1" in out and "trtqat calibrate --checkpoint" in out
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temp files left


def test_cli_refuses_an_fp32_checkpoint(fp32_run, tmp_path, capsys):
    out = tmp_path / "sens"
    assert main(["sensitivity", "-c", str(fp32_run / "best.pt"), "--out", str(out),
                 "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "trtqat calibrate --checkpoint" in err, err
    assert not out.exists()


def test_qat_skip_layers_recorded_with_the_calibrate_ones(fp32_run, tmp_path):
    from trtqat.stages.calibrate import CalibrateConfig, calibrate
    from trtqat.stages.qat import QATConfig, qat_finetune

    tiny = {"limit_batches": 2, "progress": False, "device": "cpu"}
    calibrate(CalibrateConfig(checkpoint=str(fp32_run / "best.pt"), out=str(tmp_path / "ptq"),
                              method="max", num_batches=1, skip_layers=("fc",), **tiny))
    qat_finetune(QATConfig(checkpoint=str(tmp_path / "ptq" / "best.pt"),
                           out=str(tmp_path / "qat"), epochs=1,
                           skip_layers=("layer1.0.conv1", "fc"), **tiny))
    ckpt = load_checkpoint(tmp_path / "qat" / "last.pt")
    assert ckpt["model"]["skip_layers"] == ["fc", "layer1.0.conv1"]
    model = build_from_checkpoint(ckpt)
    units = layer_units(model)
    assert "fc" not in units and "layer1.0.conv1" not in units and "layer1.0.conv2" in units
    assert model.layer1[0].conv1._input_quantizer.disabled


def test_qat_unknown_skip_pattern(ptq_run, tmp_path, capsys):
    out = tmp_path / "qat"
    assert main(["qat", "-c", str(ptq_run), "--skip-layers", "nope*", "--out", str(out),
                 "--epochs", "1", "--limit-batches", "1", "--no-progress",
                 "--device", "cpu"]) == 1
    assert "matches no quantized layer" in capsys.readouterr().err


def test_help(capsys):
    from trtqat.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["sensitivity", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert all(w in text for w in ("--mode", "one-off", "--metric", "--batches", "--suggest",
                                   "--skip-layers"))

"""QAT in the user's own loop: a calibrated model fine-tunes in a plain PyTorch loop with
``trtqat.qat_recipe`` (TensorRT's recipe), keeps its quantizer ranges and still exports."""

from __future__ import annotations

import math

import onnx
import pytest
import torch
import torch.nn.functional as F

import trtqat
from trtqat.quant.model_ops import quantizers
from trtqat.runopts import ConfigError


def test_a_quantized_model_fine_tunes_in_a_plain_loop(tiny_qcnn, images, tmp_path):
    model = tiny_qcnn
    labels = torch.arange(32) % 4
    amax = {n: q.amax.clone() for n, q in quantizers(model) if q.amax is not None}
    assert len(amax) == 7  # inputs of two convs, the pooling and the linear; three weights
    conv = model[0].weight.detach().clone()
    recipe = trtqat.qat_recipe(fp32_epochs=30, fp32_lr=10.0, steps_per_epoch=4)
    assert (recipe.epochs, recipe.lr, recipe.min_lr) == (3, 0.1, pytest.approx(1e-3))
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=0.9)
    scheduler = recipe.scheduler(optimizer)
    model.train()
    losses, rates = [], []
    for _ in range(recipe.epochs):
        for i in range(0, 32, 8):
            loss = F.cross_entropy(model(images[i:i + 8]), labels[i:i + 8])
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-4:]) < sum(losses[:4])  # the last epoch fits better than the first
    assert rates[0] == recipe.lr and rates == sorted(rates, reverse=True)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(recipe.min_lr)
    assert not torch.equal(model[0].weight, conv)  # the weights trained
    for name, value in amax.items():  # the ranges did not
        assert torch.equal(dict(quantizers(model))[name].amax, value), name
    result = trtqat.export_onnx(model.eval(), images[:2], tmp_path / "qat.onnx", "int8",
                                validation_data=[images])
    assert result.passed and result.lint.ok and (tmp_path / "qat.onnx").is_file()
    ops = [n.op_type for n in onnx.load(str(tmp_path / "qat.onnx")).graph.node]
    assert ops.count("DequantizeLinear") == 7  # one per quantizer


def test_the_recipe_is_tensorrts_and_the_cnn_familys():
    recipe = trtqat.qat_recipe(fp32_epochs=90, fp32_lr=0.1, steps_per_epoch=100)
    assert (recipe.epochs, recipe.total_steps()) == (9, 900)
    assert recipe.lr == pytest.approx(1e-3) and recipe.min_lr == pytest.approx(1e-5)
    assert recipe.lr_at(0) == recipe.lr and recipe.lr_at(900) == pytest.approx(recipe.min_lr)
    assert recipe.lr_at(450) == pytest.approx((recipe.lr + recipe.min_lr) / 2)
    assert trtqat.qat_recipe(5, 0.05).epochs == 1  # at least one epoch
    custom = trtqat.qat_recipe(90, 0.1, epochs=2, lr=0.01)
    assert (custom.epochs, custom.lr, custom.min_lr) == (2, 0.01, pytest.approx(1e-4))
    # `trtqat qat` derives its defaults from the same constants
    from trtqat.families.cnn import CNNFamily
    from trtqat.stages.qat import QATConfig

    cli = CNNFamily().recipe("qat", QATConfig(checkpoint="ptq.pt"),
                             {"train_args": {"epochs": 90, "lr": 0.1}})
    assert (cli["epochs"], cli["lr"], cli["min_lr"]) == (recipe.epochs, recipe.lr,
                                                          recipe.min_lr)


def test_the_scheduler_restarts_an_optimizer_that_ran_the_fp32_schedule():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    fp32 = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(3):
        optimizer.step()
        fp32.step()
    recipe = trtqat.qat_recipe(fp32_epochs=10, fp32_lr=0.1, steps_per_epoch=5)
    scheduler = recipe.scheduler(optimizer)
    assert scheduler.get_last_lr() == [pytest.approx(recipe.lr)]
    for _ in range(recipe.total_steps()):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr() == [pytest.approx(recipe.min_lr)]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: trtqat.qat_recipe(0, 0.1), "fp32_epochs must be > 0"),
    (lambda: trtqat.qat_recipe(10, float("nan")), "fp32_lr must be a finite number > 0"),
    (lambda: trtqat.qat_recipe(10, 0.1, min_lr=0.5), "min_lr (0.5) must be >= 0 and below"),
    (lambda: trtqat.qat_recipe(10, 0.1, steps_per_epoch=0), "steps_per_epoch must be"),
    (lambda: trtqat.qat_recipe(10, 0.1).total_steps(), "pass steps_per_epoch=len(loader)"),
])
def test_bad_recipe_values_are_one_line_errors(call, message):
    with pytest.raises(ConfigError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)

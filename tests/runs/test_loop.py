"""The epoch loop: cosine schedule, loss going down, metrics."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trtqat.runs import distributed as D
from trtqat.runs.loop import cosine_lambda, evaluate, train_one_epoch
from trtqat.runs.recipes import build_optimizer, build_scheduler


def test_cosine_starts_at_one_and_ends_at_final_ratio():
    f = cosine_lambda(100, 0, 0.01)
    assert f(0) == pytest.approx(1.0)
    assert f(50) == pytest.approx(0.01 + 0.99 * 0.5)
    assert f(100) == pytest.approx(0.01)
    assert all(f(i) >= f(i + 1) for i in range(100))


def test_warmup_is_linear_then_cosine():
    f = cosine_lambda(20, 10, 0.0)
    assert [f(i) for i in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(10) == pytest.approx(1.0)
    assert f(20) == pytest.approx(0.0)


def test_train_one_epoch_lowers_the_loss_and_steps_the_lr():
    torch.manual_seed(0)
    x = torch.randn(32, 10)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    batches = [(x[:16], y[:16]), (x[16:], y[16:])]
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = build_optimizer("sgd", model, 0.1, 0.9, 0.0)
    sched = build_scheduler(opt, total_steps=20, warmup_steps=0, final_ratio=0.01)
    ctx = D.DistContext()
    first = evaluate(model, batches, ctx, progress=False)
    for epoch in range(10):
        stats = train_one_epoch(model, batches, nn.CrossEntropyLoss(), opt, sched, ctx, epoch,
                                progress=False)
    last = evaluate(model, batches, ctx, progress=False)
    assert last["loss"] < 0.5 * first["loss"]
    assert last["top1"] > first["top1"]
    assert stats["images"] == 32 and stats["images_per_s"] > 0
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.01)


def test_evaluate_top1_top5():
    logits = torch.tensor([[9.0, 8, 7, 6, 5, 4], [0, 1, 2, 3, 4, 5]])
    model = nn.Identity()
    loader = [(logits, torch.tensor([0, 0]))]
    m = evaluate(model, loader, progress=False)
    assert m["top1"] == 50.0 and m["top5"] == 50.0 and m["images"] == 2
    assert math.isfinite(m["loss"])

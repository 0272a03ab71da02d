"""--cuda-graphs (trtqat.runs.graphed_step): the static-buffer step against the plain one,
the partial batch it drops, and every refusal (Python and command line)."""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from tiny_qcnn import tiny_qcnn
from torch import nn

from trtqat.cli import main
from trtqat.families.cnn.graphs import check_graphable, graphed_step
from trtqat.quant.model_ops import enable_calibration
from trtqat.runs import distributed as D
from trtqat.runs.accel import Accel, AccelError, check_cuda_graphs
from trtqat.runs.graphed_step import GraphedStep
from trtqat.runs.loop import train_one_epoch
from trtqat.runs.recipes import build_optimizer, build_scheduler, steps_per_epoch

FAST = ["--data", "synthetic", "--image-size", "16", "--batch-size", "8", "--limit-batches",
        "2", "--no-progress"]


def _batches(device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    full = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
            for _ in range(6)]
    last = (torch.randn(5, 3, 16, 16, generator=g), torch.randint(0, 4, (5,), generator=g))
    return [(x.to(device), y.to(device)) for x, y in [*full, last]]


def _train(model, opt_name, batches, device, graphed: bool, capture: bool = False):
    """One epoch of ``train_one_epoch``; the graphed run sees the partial batch too."""
    opt = build_optimizer(opt_name, model, 0.05, 0.9, 1e-3, graphs=True)
    sched = build_scheduler(opt, total_steps=6, warmup_steps=0, final_ratio=0.1)
    crit = nn.CrossEntropyLoss()
    step = GraphedStep(model, crit, opt, device, capture=capture) if graphed else None
    stats = train_one_epoch(model, batches if graphed else batches[:-1], crit, opt, sched,
                            D.DistContext(device=torch.device(device)), 1, progress=False,
                            graphed=step)
    return stats, opt, step


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_static_buffer_step_is_bit_identical_to_the_plain_step(opt_name, caplog):
    """Copying batches into static buffers and updating in place (weights, BN statistics,
    amax, optimizer state, the LR tensor) trains exactly like the plain loop; the partial
    batch is dropped with one NOTE."""
    plain, graphed = tiny_qcnn(), tiny_qcnn()
    batches = _batches()
    ref, ref_opt, _ = _train(plain, opt_name, batches, "cpu", graphed=False)
    with caplog.at_level(logging.INFO, logger="trtqat.runs.loop"):
        got, opt, step = _train(graphed, opt_name, batches, "cpu", graphed=True)
    assert step.eager_steps == 6 and step.graph is None
    assert got["images"] == ref["images"] == 48
    assert got["loss"] == ref["loss"]
    for (name, a), b in zip(plain.state_dict().items(), graphed.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(ref_opt.param_groups[0]["lr"], opt.param_groups[0]["lr"])
    notes = [r.getMessage() for r in caplog.records if "NOTE" in r.getMessage()]
    assert len(notes) == 1 and "5 sample(s)" in notes[0], notes


def test_graph_optimizer_trains_like_the_plain_optimizer():
    """build_optimizer(graphs=True) (fused, LR as a tensor the scheduler fills) follows the
    same schedule and updates as the default optimizer."""
    a, b = tiny_qcnn(), tiny_qcnn()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    for model, graphs in ((a, False), (b, True)):
        opt = build_optimizer("sgd", model, 0.05, 0.9, 1e-3, graphs=graphs)
        sched = build_scheduler(opt, total_steps=4, warmup_steps=0, final_ratio=0.1)
        for _ in range(4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    assert isinstance(b_lr := opt.param_groups[0]["lr"], torch.Tensor)
    assert float(b_lr) == pytest.approx(0.005)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_steps_per_epoch_leaves_out_the_partial_batch():
    loader = torch.utils.data.DataLoader(list(range(21)), batch_size=8)
    assert steps_per_epoch(loader, None) == 3
    assert steps_per_epoch(loader, None, drop_last=True) == 2
    assert steps_per_epoch(loader, 1, drop_last=True) == 1


@pytest.mark.parametrize("opts, device, match", [
    ({}, "cpu", "needs a CUDA GPU"),
    ({"amp": "fp16"}, "cuda", "gradient scaler"),
    ({"compile": True}, "cuda", "exclude each other"),
])
def test_check_cuda_graphs_refuses(opts, device, match):
    with pytest.raises(AccelError, match=match):
        check_cuda_graphs(SimpleNamespace(cuda_graphs=True, **opts), torch.device(device))
    with pytest.raises(AccelError, match="image classifiers"):
        Accel.setup(SimpleNamespace(cuda_graphs=True), torch.device("cpu"), graphs=False)
    check_cuda_graphs(SimpleNamespace(cuda_graphs=False, **opts), torch.device(device))


def test_check_cuda_graphs_refuses_several_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(AccelError, match="one process"):
        check_cuda_graphs(SimpleNamespace(cuda_graphs=True), torch.device("cuda"))


def test_model_checks_refuse_calibration_and_unsigned_quantizers():
    model = tiny_qcnn()
    check_graphable(model)
    acc = Accel("cpu", cuda_graphs=True)
    opt = build_optimizer("sgd", model, 0.1, 0.9, 0.0, graphs=True)
    assert graphed_step(model, nn.CrossEntropyLoss(), opt, Accel("cpu"), capture=False) is None
    assert graphed_step(model, nn.CrossEntropyLoss(), opt, acc, capture=False) is not None
    calib = copy.deepcopy(model)
    enable_calibration(calib)
    with pytest.raises(AccelError, match="still collect calibration statistics"):
        graphed_step(calib, nn.CrossEntropyLoss(), opt, acc, capture=False)
    model[0].input_quantizer.unsigned = True
    with pytest.raises(AccelError, match="unsigned quantizer"):
        check_graphable(model)


def test_cli_refuses_cuda_graphs_in_one_line(tmp_path, capsys):
    """On the CPU: one line, exit 1, no run folder; and the Python API raises the same."""
    assert main(["train", *FAST, "--device", "cpu", "--cuda-graphs", "--out",
                 str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err, err
    assert "Traceback" not in err and not (tmp_path / "a").exists()
    from trtqat.stages.train import TrainConfig, train_fp32

    with pytest.raises(AccelError, match="needs a CUDA GPU"):
        train_fp32(TrainConfig(data="synthetic", image_size=16, device="cpu",
                               cuda_graphs=True, out=str(tmp_path / "b"), progress=False))
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_captured_step_matches_the_eager_step_on_cuda():
    """The captured graph replays the step: same weights as eager steps, within float noise
    (cuDNN may pick other kernels); the LR schedule reaches the replayed steps."""
    torch.backends.cudnn.deterministic = True
    plain, graphed = tiny_qcnn().cuda(), tiny_qcnn().cuda()
    batches = _batches("cuda")
    ref, ref_opt, _ = _train(plain, "sgd", batches, "cuda", graphed=False)
    got, opt, step = _train(graphed, "sgd", batches, "cuda", graphed=True, capture=True)
    assert step.failed is None and step.graph is not None and step.eager_steps == 3
    assert got["images"] == 48
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-4)
    for (name, a), b in zip(plain.state_dict().items(), graphed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(float(ref_opt.param_groups[0]["lr"]))


@pytest.mark.parametrize("saved_graphs, graphs", [(True, False), (False, True)])
def test_resume_switches_cuda_graphs_on_or_off(saved_graphs, graphs, tmp_path):
    """--cuda-graphs may change on --resume: a tensor rate saved by a graphed run becomes a
    float again without it, and a float rate becomes the graphed step's device tensor."""
    from trtqat.runs.recipes import restore

    model = tiny_qcnn()
    opt = build_optimizer("sgd", model, 0.05, 0.9, 0.0, graphs=saved_graphs)
    sched = build_scheduler(opt, total_steps=4, warmup_steps=0, final_ratio=0.1)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    sched.step()
    torch.save({"state_dict": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "epoch": 1}, tmp_path / "last.pt")
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    model2 = tiny_qcnn()
    opt2 = build_optimizer("sgd", model2, 0.05, 0.9, 0.0, graphs=graphs)
    sched2 = build_scheduler(opt2, total_steps=4, warmup_steps=0, final_ratio=0.1)
    restore(ckpt, model2, opt2, sched2, D.DistContext())
    if graphs:
        GraphedStep(model2, nn.CrossEntropyLoss(), opt2, "cpu", capture=False)
    lr = opt2.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) == graphs
    sched2.step()
    assert isinstance(opt2.param_groups[0]["lr"], torch.Tensor) == graphs
    assert float(opt2.param_groups[0]["lr"]) == pytest.approx(0.05 * cosine(2, 4, 0.1))
    before = model2[0].weight.detach().clone()
    nn.functional.cross_entropy(model2(x), y).backward()
    opt2.step()  # steps with the restored rate, float or tensor
    assert not torch.equal(before, model2[0].weight)


def cosine(step: int, total: int, final: float) -> float:
    from trtqat.runs.loop import cosine_lambda

    return cosine_lambda(total, 0, final)(step)

"""--amp, --channels-last and --compile (trtqat.runs.accel) on the CNN recipes, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from tiny_qcnn import tiny_qcnn
from torch import nn

from trtqat.cli import main
from trtqat.families import build_from_checkpoint
from trtqat.families.cnn.models import build_model
from trtqat.runs import accel
from trtqat.runs import distributed as D
from trtqat.runs.accel import Accel, AccelError
from trtqat.runs.checkpoint import load_checkpoint
from trtqat.runs.loop import train_one_epoch
from trtqat.runs.recipes import build_optimizer, build_scheduler, restore

FAST = ["--data", "synthetic", "--image-size", "16", "--batch-size", "8", "--limit-batches",
        "2", "--no-progress", "--device", "cpu"]


def _fails(argv, capsys, match):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert match in err, err
    assert "Traceback" not in err


def test_compiled_qat_step_gives_the_eager_loss():
    """inductor on the CPU: three SGD steps of a quantized CNN, same losses as eager."""
    eager = tiny_qcnn()
    fast = copy.deepcopy(eager)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    compiled = Accel("cpu", compile=True).compiled(fast)
    assert compiled is not fast
    losses = {}
    for name, model, params in (("eager", eager, eager), ("compiled", compiled, fast)):
        acc = Accel("cpu")
        opt = torch.optim.SGD(params.parameters(), lr=0.1, momentum=0.9)
        losses[name] = []
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            acc.backward_step(loss, opt)
            losses[name].append(loss.item())
    assert losses["eager"][2] != losses["eager"][0]  # the steps did change the model
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-4, abs=1e-5)
    assert set(accel.plain_state_dict(compiled)) == set(eager.state_dict())


def test_bf16_autocast_runs_the_step_in_bf16_and_keeps_float32_weights():
    model = tiny_qcnn()
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    batches = [(torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,)))] * 2
    opt = build_optimizer("sgd", model, 0.1, 0.9, 0.0)
    sched = build_scheduler(opt, 2, 0, 0.1)
    before = model[0].weight.detach().clone()
    stats = train_one_epoch(model, batches, nn.CrossEntropyLoss(), opt, sched, D.DistContext(),
                            1, progress=False, accel=Accel("cpu", amp="bf16"))
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert stats["images"] == 16
    assert not torch.equal(before, model[0].weight)
    assert all(v.dtype == torch.float32 for v in model.state_dict().values()
               if v.is_floating_point())


def test_fp16_scaler_step_equals_the_plain_step_with_clipping():
    """The gradient-scaler path (fp16 on a GPU) unscales before clipping and stepping."""
    a = tiny_qcnn()
    b = copy.deepcopy(a)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    plain, scaled = Accel("cpu"), Accel("cpu")
    scaled.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for model, acc in ((a, plain), (b, scaled)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        acc.backward_step(nn.functional.cross_entropy(model(x), y), opt,
                          clip=(list(model.parameters()), 0.01))
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(va, vb, atol=1e-6), k
    state = scaled.checkpoint_state()
    assert state["grad_scaler"]["scale"] == 1024.0
    fresh = Accel("cpu")
    fresh.scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    fresh.load_checkpoint_state(state)
    assert fresh.scaler.get_scale() == 1024.0


def test_compiled_wrapper_keys_and_channels_last_are_stripped_from_checkpoints():
    model = build_model("resnet18", 4)
    Accel("cpu", channels_last=True).prepare(model)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    wrapped = torch.compile(model)  # compiles lazily: nothing is traced here
    assert any(k.startswith("_orig_mod.") for k in wrapped.state_dict())
    state = accel.plain_state_dict(wrapped)
    assert list(state) == list(model.state_dict())
    assert all(v.is_contiguous() for v in state.values())
    # a resume checkpoint saved from a wrapper by older code still restores
    prefixed = {"_orig_mod." + k: v for k, v in state.items()}
    plain = build_model("resnet18", 4)
    opt = build_optimizer("sgd", plain, 0.1, 0.9, 0.0)
    sched = build_scheduler(opt, 2, 0, 0.1)
    ckpt = {"state_dict": prefixed, "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "epoch": 1}
    assert restore(ckpt, plain, opt, sched, D.DistContext())[0] == 1
    assert torch.equal(plain.conv1.weight, model.conv1.weight)


def test_train_amp_bf16_channels_last_checkpoint_is_float32_and_loads(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "resnet18", "--epochs", "1", "--amp", "bf16",
                 "--channels-last", "--out", str(out), *FAST]) == 0
    args = yaml.safe_load((out / "args.yaml").read_text())
    assert (args["amp"], args["channels_last"], args["compile"]) == ("bf16", True, False)
    ckpt = torch.load(out / "best.pt", weights_only=True, map_location="cpu")
    floats = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 and v.is_contiguous() for v in floats)
    plain = build_model("resnet18", int(ckpt["model"]["num_classes"]))
    plain.load_state_dict(ckpt["state_dict"])  # strict: same keys as a plain model
    assert build_from_checkpoint(load_checkpoint(out / "best.pt")) is not None


def test_qat_compile_checkpoint_has_plain_keys_and_resumes(ptq_run, tmp_path, capsys,
                                                           monkeypatch):
    """--compile (dynamo with the eager backend: no code generation, fast) and --resume."""
    monkeypatch.setattr(accel, "COMPILE_BACKEND", "eager")
    compiled = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or real(fn, **kw))
    out = tmp_path / "qat"
    argv = ["qat", "-c", str(ptq_run), "--epochs", "2", "--compile", "--out", str(out),
            "--limit-batches", "2", "--no-progress", "--device", "cpu"]
    assert main([*argv, "--stop-after", "1"]) == 0
    assert any(isinstance(fn, nn.Module) for fn in compiled)  # the model, not only the probe
    assert load_checkpoint(out / "last.pt")["epoch"] == 1
    assert main([*argv, "--resume"]) == 0
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt["epoch"] == 2 and ckpt["args"]["compile"] is True
    assert set(ckpt["state_dict"]) == set(load_checkpoint(ptq_run)["state_dict"])
    build_from_checkpoint(ckpt)


@pytest.mark.parametrize("target, value, match", [
    ("torch._dynamo.is_dynamo_supported", lambda: False, "does not support Python"),
    ("trtqat.runs.accel._cpp_compiler", lambda: None, "needs a C++ compiler"),
    ("torch.compile", None, "torch.compile does not work here (RuntimeError: no compiler"),
])
def test_compile_unavailable_is_one_line(target, value, match, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler for you\nsecond line")

    monkeypatch.setattr(target, value or broken)
    out = tmp_path / "run"
    _fails(["train", "--compile", "--out", str(out), *FAST], capsys, match)
    assert not out.exists()


def test_amp_fp16_on_the_cpu_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    _fails(["train", "--amp", "fp16", "--out", str(out), *FAST], capsys,
           "--amp fp16 needs a CUDA GPU")
    assert not out.exists()
    with pytest.raises(AccelError, match="unknown --amp"):
        accel.check_options(accel.AccelOptions(amp="fp8"))


def test_device_cuda_without_a_gpu_is_one_line_everywhere(fp32_run, ptq_run, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    cuda = ["--device", "cuda", "--out", str(out)]
    for argv in (["train", "--data", "synthetic", *cuda],
                 ["calibrate", "-c", str(fp32_run), *cuda],
                 ["qat", "-c", str(ptq_run), *cuda],
                 ["calibrate", "-c", str(fp32_run), "--amp", "bf16", "--compile", *cuda],
                 ["sensitivity", "-c", str(ptq_run), *cuda],
                 ["demo", "--device", "cuda", "--runs", str(out)]):
        _fails(argv, capsys, "no CUDA GPU is visible")
    assert not out.exists()


def _stub_demo_stages(monkeypatch, record) -> list:
    """The demo with every stage stubbed: ``record(cfg)`` for each training-stage call (the
    demo finds the family once and calls its stage hooks); returns the list that collects
    the CompareConfig of each model."""
    from types import SimpleNamespace

    from trtqat.families.cnn import CNNFamily
    from trtqat.runs import checkpoint
    from trtqat.stages import demo

    def stage(result):
        return lambda self, cfg, *src: record(cfg) or result

    monkeypatch.setattr(CNNFamily, "run_train", stage({}))
    monkeypatch.setattr(CNNFamily, "run_calibrate", stage({"best_top1": 50.0}))
    monkeypatch.setattr(CNNFamily, "run_qat", stage({}))
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda path: {})
    compared: list = []
    monkeypatch.setattr(demo, "compare", lambda cfg, echo: compared.append(cfg) or cfg.run)
    monkeypatch.setattr(demo, "write_demo_report", lambda sections, out: SimpleNamespace(
        glance="", files=dict.fromkeys(("md", "json", "png"), out), sections=sections))
    return compared


def test_demo_passes_its_device_to_every_training_stage(tmp_path, monkeypatch):
    from trtqat.stages import demo

    seen = []
    monkeypatch.setattr(D, "pick_device", lambda name, local_rank=0: torch.device("cpu"))
    compared = _stub_demo_stages(monkeypatch,
                                 lambda cfg: seen.append((type(cfg).__name__, cfg.device)))
    models = ["resnet18", "mobilenet_v2"]
    report = demo.run_demo(demo.DemoConfig(model=",".join(models), device="cuda",
                                           runs=str(tmp_path)), echo=lambda s: None)
    one_model = ["TrainConfig"] + ["CalibrateConfig"] * 5 + ["QATConfig"]
    assert [name for name, _ in seen] == one_model * len(models)  # every model
    assert {dev for _, dev in seen} == {"cuda"}
    assert [s.model for s in report.sections] == models
    # each model in its own run folder and engine folder
    assert [c.run for c in compared] == [str(tmp_path / m) for m in models]
    assert len({c.out for c in compared}) == len(models)
    assert demo.DemoConfig().models == demo.DEMO_MODELS


def test_demo_threads_reach_training_and_are_restored(tmp_path, monkeypatch):
    """``trtqat demo --threads 1``: the training stages run on one torch thread (on a loaded
    machine two threads made a MobileNetV2 epoch 20x slower), ORT gets it too, and torch's
    own count comes back afterwards."""
    from trtqat.stages import demo

    seen = []
    compared = _stub_demo_stages(monkeypatch, lambda cfg: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        demo.run_demo(demo.DemoConfig(model="resnet18", device="cpu", threads=1,
                                      runs=str(tmp_path)), echo=lambda s: None)
        assert seen and set(seen) == {1}
        assert compared[0].threads == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_and_qat_fp16_channels_last_compile_on_cuda(ptq_run, tmp_path):
    gpu = [a if a != "cpu" else "cuda" for a in FAST]
    assert main(["train", "--epochs", "1", "--amp", "fp16", "--channels-last", "--compile",
                 "--out", str(tmp_path / "fp32"), *gpu]) == 0
    assert main(["qat", "-c", str(ptq_run), "--epochs", "1", "--amp", "bf16",
                 "--channels-last", "--compile", "--out", str(tmp_path / "qat"),
                 "--limit-batches", "2", "--no-progress", "--device", "cuda"]) == 0
    ckpt = load_checkpoint(tmp_path / "fp32" / "best.pt")
    assert "grad_scaler" in ckpt
    assert all(v.dtype == torch.float32 for v in ckpt["state_dict"].values()
               if v.is_floating_point())

"""README "Your own model": a model in the user's file, its own weights, calibrated from a
flat image folder, fine-tuned, exported to INT8 with dynamic shapes, built and run on ORT."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
import yaml
from byom_testlib import make_float, write_image_folder, write_model, write_pngs

from trtqat.cli import main
from trtqat.cli.exec_cmd import main as exec_main

FAST = ["--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's files: my_net.py, my_net.pt, a flat folder and a labelled folder."""
    root = tmp_path_factory.mktemp("byom")
    model_file = write_model(root)
    torch.save(make_float(model_file).state_dict(), root / "my_net.pt")
    write_pngs(root / "calib", 6, size=(24, 20))
    write_image_folder(root / "labelled")
    return root


def test_own_model_from_flat_folder_to_ort_engine(user, tmp_path, capsys, caplog):
    ptq, qat, exported = tmp_path / "runs" / "ptq", tmp_path / "runs" / "qat", tmp_path / "onnx"
    assert main(["calibrate", "--model", f"{user / 'my_net.py'}:make", "--weights",
                 str(user / "my_net.pt"), "--data", str(user / "calib"), "--image-size", "16",
                 "--batch-size", "4", "--num-batches", "2", "--out", str(ptq), *FAST]) == 0
    args = yaml.safe_load((ptq / "args.yaml").read_text())
    assert args["model"] == f"{(user / 'my_net.py').resolve()}:make"
    assert args["image_size"] == 16 and args["channels"] == 3 and len(args["mean"]) == 3
    source = torch.load(ptq / "best.pt", weights_only=True)["model"]["source"]
    assert source["weights"] == str((user / "my_net.pt").resolve())
    assert len(source["weights_sha256"]) == 64

    assert main(["qat", "--checkpoint", str(ptq), "--data", str(user / "labelled"),
                 "--epochs", "1", "--batch-size", "4", "--out", str(qat), *FAST]) == 0
    # no FP32 run to derive the schedule from: the warning says what is assumed and the fix
    assumed = [r.getMessage() for r in caplog.records if "no FP32 training run" in r.getMessage()]
    assert len(assumed) == 1 and "1 epochs from lr " in assumed[0]
    assert "pass --epochs and --lr" in assumed[0]
    assert main(["export", "--checkpoint", str(qat), "--variant", "int8", "--out",
                 str(exported), "--dynamic", "batch,height,width"]) == 0
    onnx_path = exported / "my_net.make-qat-int8.onnx"
    model = onnx.load(str(onnx_path))
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    assert "QuantizeLinear" in {n.op_type for n in model.graph.node}
    assert json.loads((exported / "export.json").read_text())["dynamic"] == [
        "batch", "height", "width"]

    engine = tmp_path / "my_net.engine"
    assert main(["build", "--onnx", str(onnx_path), "--out", str(engine)]) == 0
    assert exec_main([f"--loadEngine={engine}", "--shapes=input:2x3x24x20",
                      "--duration=0.05", "--warmUp=0", "--iterations=2"]) == 0
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    out = session.run(None, {"input": np.zeros((3, 3, 20, 28), np.float32)})[0]
    assert out.shape == (3, 10)
    capsys.readouterr()


def test_later_steps_rebuild_from_the_checkpoint(user, tmp_path, capsys):
    """Sensitivity on a run started from a file model, with the preprocessing it recorded."""
    ptq = tmp_path / "ptq"
    assert main(["calibrate", "--model", f"{user / 'my_net.py'}:make", "--weights",
                 str(user / "my_net.pt"), "--data", str(user / "labelled"), "--image-size",
                 "16x12", "--mean", "0.5", "--std", "0.5", "--batch-size", "4",
                 "--num-batches", "1", "--out", str(ptq), *FAST]) == 0
    prep = torch.load(ptq / "best.pt", weights_only=True)["model"]["preprocess"]
    assert prep["size"] == [16, 12] and prep["mean"] == [0.5]
    assert main(["sensitivity", "-c", str(ptq), "--batches", "1", "--no-progress",
                 "--out", str(tmp_path / "sens")]) == 0
    assert json.loads((tmp_path / "sens" / "sensitivity.json").read_text())["rows"]
    capsys.readouterr()


@pytest.mark.parametrize("model, extra, match", [
    ("my_net.py:not_a_model", [], "returned a int, not a torch.nn.Module"),
    ("my_net.py:nope", [], "has no function 'nope'"),
    ("missing.py:make", [], "missing.py does not exist"),
    ("my_net.py:gray", ["--weights", "my_net.pt"], "does not fit the model: missing 4.weight, 4.bias; unexpected 1.weight"),
    ("my_net.py:make", ["--data", "empty"], "holds no images"),
])
def test_bad_user_inputs_fail_with_one_line(user, tmp_path, capsys, model, extra, match):
    (user / "empty").mkdir(exist_ok=True)
    (user / "empty" / "x.png").write_bytes(b"")
    argv = ["calibrate", "--model", str(user / model), "--data", str(user / "calib"),
            "--image-size", "16", "--out", str(tmp_path / "run"), *FAST]
    for i, a in enumerate(extra):
        argv.append(str(user / a) if i % 2 else a)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert not (tmp_path / "run").exists()


def test_train_a_grayscale_file_model_from_weights_and_export_it(user, tmp_path, capsys):
    torch.save(make_float(user / "my_net.py", "gray", num_classes=4).state_dict(),
               tmp_path / "gray.pt")
    run = tmp_path / "fp32"
    assert main(["train", "--model", f"{user / 'my_net.py'}:gray", "--weights",
                 str(tmp_path / "gray.pt"), "--num-classes", "4", "--channels", "1",
                 "--data", "synthetic", "--image-size", "16x12", "--epochs", "1",
                 "--limit-batches", "2", "--batch-size", "8", "--out", str(run), *FAST]) == 0
    spec = torch.load(run / "best.pt", weights_only=True)["model"]
    assert spec["source"]["weights_sha256"] and spec["preprocess"]["channels"] == 1
    assert main(["export", "--checkpoint", str(run), "--variant", "fp32", "--batch", "1",
                 "--dynamic", "height,width", "--out", str(tmp_path / "x"),
                 "--val-batches", "1"]) == 0
    model = onnx.load(str(tmp_path / "x" / "my_net.gray-fp32-b1.onnx"))
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, "height", "width"]
    assert main(["export", "--checkpoint", str(run), "--variant", "fp32", "--batch", "1",
                 "--dynamic", "batch", "--out", str(tmp_path / "y")]) == 1
    assert "--batch 1 fixes the batch" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(run), "--variant", "fp32", "--dynamic",
                 "depth", "--out", str(tmp_path / "y")]) == 1
    assert "unknown axis 'depth'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readmes_own_chain_runs_as_written(tmp_path, capsys):
    """README "Your own model", its own lines in its order, in an empty folder: my_net.py,
    make_stand_ins.py (my_net.pt, calib/, my_images/), then every command of the chain."""
    import os
    import shlex
    import subprocess
    import sys

    from readme_lib import README, code_blocks, command_lines, file_name, section

    text = section("Your own model")
    files = {file_name(code): code for _, code in code_blocks(text, "python") if file_name(code)}
    assert set(files) == {"my_net.py", "make_stand_ins.py"}
    [chain] = [block for _, block in code_blocks(text, "") if "my_net.py:make" in block]
    commands = command_lines(chain)
    assert [c.split()[:2] for c in commands][:3] == [
        ["trtqat", "calibrate"], ["trtqat", "qat"], ["trtqat", "export"]]
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(README.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "make_stand_ins.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mains = {"trtqat": main, "trtqat-exec": exec_main}
    for line in commands:
        words = shlex.split(line)
        assert mains[words[0]](words[1:]) == 0, line
    assert (tmp_path / "engines" / "my_net.engine").is_file()
    out = capsys.readouterr().out
    assert "Throughput" in out or "qps" in out

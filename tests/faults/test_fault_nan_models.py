"""No check passes a non-finite model: export, build and compare refuse it, naming the
first offending tensor; NaN outputs fail the export check; export.json never crashes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from faultlib import one_error_line, run_cli
from onnx import numpy_helper

from trtqat.export import validate as val
from trtqat.export.onnx_export import Exporter, ExportResult
from trtqat.families.cnn.models import build_model
from trtqat.finite import NonFiniteError, check_finite_arrays, first_non_finite, model_tensors
from trtqat.runs.checkpoint import FORMAT, save_checkpoint


@pytest.fixture
def nan_run(tmp_path):
    """A run root whose fp32/best.pt is a squeezenet1_1 with every float tensor NaN."""
    model = build_model("squeezenet1_1", 10)
    state = {k: v.fill_(float("nan")) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    path = tmp_path / "runs" / "fp32" / "best.pt"
    path.parent.mkdir(parents=True)
    torch.save({"format": FORMAT, "stage": "fp32", "state_dict": state, "epoch": 1,
                "model": {"arch": "squeezenet1_1", "num_classes": 10, "image_size": 32,
                          "quantized": False, "skip_layers": []},
                "args": {"data": "synthetic", "image_size": 32}}, path)
    return tmp_path / "runs"


def test_export_refuses_a_nan_checkpoint(nan_run, tmp_path, capsys):
    out = tmp_path / "export"
    rc, err = run_cli(capsys, ["export", "--checkpoint", str(nan_run / "fp32" / "best.pt"),
                               "--variant", "fp32", "--out", str(out)])
    one_error_line(rc, err, "is not finite: 'features.0.weight' holds 1728 of 1728 non-finite")
    assert not out.exists() or list(out.iterdir()) == []


def test_compare_refuses_every_nan_variant(nan_run, tmp_path, capsys):
    rc, err = run_cli(capsys, ["compare", "--run", str(nan_run), "--out", str(tmp_path / "e"),
                               "--export-dir", str(tmp_path / "x"), "--data", "synthetic",
                               "--duration", "0.01", "--warmup", "0"])
    line = one_error_line(rc, err, "every variant failed")
    assert "'features.0.weight' holds" in line and "not finite" in line
    assert not list((tmp_path / "x").glob("*.onnx")) and not list((tmp_path / "e").iterdir())


def test_build_refuses_an_onnx_with_nan_weights(conv_onnx, tmp_path, capsys):
    model = onnx.load(conv_onnx)
    w = numpy_helper.to_array(model.graph.initializer[0]).copy()
    w[0, 0, 0, 0] = np.nan
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    onnx.save(model, tmp_path / "nan.onnx")
    for argv in (["build", "--onnx", str(tmp_path / "nan.onnx"), "--out", str(tmp_path / "e")],
                 ["trtqat-exec", f"--onnx={tmp_path / 'nan.onnx'}", "--skipInference"]):
        rc, err = run_cli(capsys, argv)
        one_error_line(rc, err, "is not finite: 'w' holds 1 of 108 non-finite values")
    assert not (tmp_path / "e").exists()


def test_nan_outputs_fail_the_export_check_and_export_json_is_written():
    nan = np.full((2, 10), np.nan, dtype=np.float32)
    checks = val.compare("int8", [([nan], [nan.copy()], True)], ["output"])
    finite = [c for c in checks if "finite" in c.name]
    assert len(finite) == 1 and not finite[0].passed
    assert "20 NaN/inf values from ONNX Runtime, 20 from PyTorch" in finite[0].detail
    # export.json is written with plain JSON types (numpy bools crashed it before)
    result = ExportResult("m.onnx", "int8", 17, True, checks=checks)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["passed"] is False and all(isinstance(c["passed"], bool)
                                           for c in data["checks"])


def test_finite_helpers_name_the_first_bad_tensor(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert first_non_finite(model.state_dict().items()) is None
    model[1].running_var[1] = float("inf")
    with pytest.raises(NonFiniteError, match="'1.running_var' holds 1 of 2"):
        check_finite_arrays(model_tensors(model), "the model", "retrain it")
    with pytest.raises(NonFiniteError, match="'1.running_var'"):
        save_checkpoint(tmp_path / "last.pt", {"state_dict": model.state_dict()})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(NonFiniteError, match="the model to export is not finite"):
        Exporter(model, torch.randn(2, 2))


def test_compare_refuses_nan_engine_outputs():
    from types import SimpleNamespace

    from trtqat import families
    from trtqat.stages.compare.run import score

    class NanRunner:
        def infer(self, feed):
            return {"y": np.full((2, 10), np.nan, dtype=np.float32)}

    data = SimpleNamespace(batches=[np.zeros((2, 3, 8, 8), np.float32)],
                           targets=np.zeros(2, int), output=None)
    with pytest.raises(NonFiniteError, match="the engine's output is not finite: 'outputs'"):
        score(NanRunner(), data, ["x"], families.get("cnn"), "m.onnx")

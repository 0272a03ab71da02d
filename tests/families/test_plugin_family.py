"""A new model family is one module and one registry entry: the plug-in MLP family of
``plugin_family.py`` goes through train, calibrate, qat, export and an engine from the CLI
with its own recipe, metadata and engine hints, and no stage code knows its name."""

from __future__ import annotations

import json

import onnx
import pytest
import yaml

from trtqat import families
from trtqat.cli import main
from trtqat.families import registry


@pytest.fixture
def mlp_registered(monkeypatch):
    entry = ("mlp", "tests.families.plugin_family:MLPFamily")
    monkeypatch.setattr(registry, "FAMILIES", [entry, *registry.FAMILIES])
    monkeypatch.setattr(families, "FAMILIES", registry.FAMILIES)
    families.get.cache_clear()
    yield
    families.get.cache_clear()


def test_a_plugin_family_runs_every_stage(mlp_registered, tmp_path, capsys):
    runs = tmp_path / "runs"
    common = ["--no-progress", "--limit-batches", "4"]
    assert main(["train", "--model", "mlp_tiny", "--image-size", "8", "-o",
                 str(runs / "fp32"), *common]) == 0
    args = yaml.safe_load((runs / "fp32" / "args.yaml").read_text())
    assert (args["opt"], args["lr"], args["epochs"], args["batch_size"]) == ("adamw", 0.01, 2,
                                                                            16)
    assert main(["calibrate", "-c", str(runs / "fp32" / "best.pt"), "-o", str(runs / "ptq"),
                 "--num-batches", "2", "--no-progress"]) == 0
    assert main(["qat", "-c", str(runs / "ptq" / "best.pt"), "-o", str(runs / "qat"),
                 *common]) == 0
    out = tmp_path / "export"
    assert main(["export", "-c", str(runs / "qat" / "best.pt"), "-o", str(out),
                 "--variant", "int8", "--val-batches", "2"]) == 0
    text = capsys.readouterr().out
    assert "PASS  TensorRT Q/DQ lint" in text and "FAIL" not in text
    path = out / "mlp_tiny-qat-int8.onnx"
    model = onnx.load(path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["trtqat.family"] == "mlp"
    assert json.loads(meta["trtqat.engine_hints"])["ort_rewrites"] == [
        "prequantize_weights", "reencode_uint8", "quantize_gemm_bias"]
    assert families.of_onnx(model).name == "mlp"
    # the ORT CPU engine runs only the plug-in's passes
    from trtqat.engines import build_engine

    engine = build_engine(path, "ort", threads=1)
    built = onnx.load_from_string(engine.payload)
    report = json.loads({p.key: p.value for p in built.metadata_props}["trtqat.cpu_reencode"])
    assert set(report["skipped_passes"]) == {"fold_constants", "fold_batchnorm",
                                             "reducemean_to_gap", "unify_quantizers",
                                             "integer_activations", "output_quantizers",
                                             "absorb_clips", "fuse_matmul_epilogues",
                                             "float_output_convs", "float_narrow_convs",
                                             "quantize_move_outputs"}
    assert report["passes"]["gemm_bias_quantized"] == 2

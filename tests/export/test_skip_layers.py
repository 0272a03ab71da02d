"""``--skip-layers`` on export: float layers without Q/DQ, recorded, and known to the lint."""

from __future__ import annotations

import copy

import onnx
import pytest
from export_testlib import batches

from trtqat.cli import main
from trtqat.export import export_onnx, lint_model
from trtqat.export.lint import SKIP_LAYERS_KEY, skip_patterns
from trtqat.quant.model_ops import disable_layers

SKIP = "layer1.0.conv1,layer2.0.residual_quantizer"


def _inputs_have_dq(model: onnx.ModelProto, node_name: str) -> bool:
    producers = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    return any(producers.get(i) is not None and producers[i].op_type == "DequantizeLinear"
               for i in node.input)


@pytest.fixture(scope="module")
def skipped_export(resnet18_ptq_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("skip")
    rc = main(["export", "--checkpoint", str(resnet18_ptq_checkpoint), "--variant", "int8",
               "--out", str(out), "--no-validate", "--skip-layers", SKIP])
    assert rc == 0
    return out / "resnet18-ptq-max-int8.onnx"  # no calib record: max


def test_skipped_layers_have_no_qdq_and_are_recorded(skipped_export):
    model = onnx.load(skipped_export)
    assert not _inputs_have_dq(model, "layer1.0.conv1/Conv")
    assert _inputs_have_dq(model, "layer1.0.conv2/Conv")
    assert skip_patterns(model) == tuple(SKIP.split(","))
    assert {p.key for p in model.metadata_props} >= {SKIP_LAYERS_KEY, "trtqat.variant"}


def test_lint_knows_they_are_float_on_purpose(skipped_export, capsys):
    report = lint_model(skipped_export)
    assert report.ok and not report.warnings, report.lines()
    infos = {(f.rule, f.node) for f in report.infos}
    assert ("float-layer", "layer1.0.conv1/Conv") in infos
    assert any(rule == "residual-add" and node.startswith("layer2.0/") for rule, node in infos)
    assert all("on purpose" in f.message for f in report.infos)
    assert main(["lint", str(skipped_export), "--strict"]) == 0
    out = capsys.readouterr().out
    assert f"0 error(s), 0 warning(s), {len(report.infos)} skipped on purpose" in out


def test_same_float_layer_without_metadata_is_a_warning(skipped_export, tmp_path):
    model = onnx.load(skipped_export)
    kept = [p for p in model.metadata_props if p.key != SKIP_LAYERS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    report = lint_model(model)
    assert {f.rule for f in report.warnings} >= {"float-layer", "residual-add"}
    assert not report.infos


def test_unknown_pattern_is_a_clear_error(resnet18_ptq_checkpoint, tmp_path, capsys):
    rc = main(["export", "--checkpoint", str(resnet18_ptq_checkpoint), "--variant", "int8",
               "--out", str(tmp_path), "--no-validate", "--skip-layers", "layer9.*"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "layer9.*" in err and "matches no quantized layer" in err
    assert not list(tmp_path.glob("*.onnx"))


def test_export_onnx_records_disabled_layers_itself(tiny_q, tmp_path):
    """The compare/demo path: export_onnx of a model with layers disabled (no CLI flag)."""
    model = copy.deepcopy(tiny_q)
    disable_layers(model, ["conv2"])
    result = export_onnx(model, batches(1, batch=2)[0], tmp_path / "t.onnx", "int8",
                         validation_data=[(x, None) for x in batches(2, seed=2)])
    assert result.passed
    onnx_model = onnx.load(tmp_path / "t.onnx")
    assert skip_patterns(onnx_model) == ("conv2",)
    assert [(f.rule, f.node) for f in result.lint.infos] == [("float-layer", "conv2/Conv")]
    assert not result.lint.warnings

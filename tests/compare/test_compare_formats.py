"""FP8 and INT4 rows in ``compare`` and ``demo``: names, order, precision of files,
agreement with FP32 and file size, and the demo's per-format summary."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.errors import TrtqatError
from trtqat.runs.checkpoint import save_checkpoint
from trtqat.stages.compare.figures import add_agreement, onnx_mib, predictions
from trtqat.stages.compare.report import VariantResult, build_report, format_table
from trtqat.stages.compare.variants import discover, file_precision
from trtqat.stages.demo import DemoConfig
from trtqat.stages.demo_report import DemoSection, run_format, summary


def _ckpt(path, stage: str, fmt: str | None = None, **extra) -> None:
    path.mkdir(parents=True)
    spec = {"arch": "resnet18", "num_classes": 10, **({"format": fmt} if fmt else {})}
    save_checkpoint(path / "best.pt", {"stage": stage, "model": spec, "args": {"data": "digits"},
                                       "state_dict": {}, **extra})


def test_each_format_gets_its_own_rows_in_report_order(tmp_path):
    _ckpt(tmp_path / "fp32", "fp32")
    _ckpt(tmp_path / "ptq-max", "ptq", calib={"method": "max"})
    _ckpt(tmp_path / "ptq-max-fp8", "ptq", "fp8", calib={"method": "max"})
    _ckpt(tmp_path / "ptq-mse-fp8", "ptq", "fp8", calib={"method": "mse"})
    _ckpt(tmp_path / "qat", "qat")
    _ckpt(tmp_path / "qat-fp8", "qat", "fp8")
    _ckpt(tmp_path / "ptq-max-int4", "ptq", "int4", calib={"method": "max"})
    variants, _ = discover(tmp_path)
    assert [(v.name, v.precision) for v in variants] == [
        ("fp32", "fp32"), ("fp16", "fp16"), ("ptq-max", "int8"), ("qat-int8", "int8"),
        ("qat-int8-fp16", "int8-fp16"), ("ptq-max-fp8", "fp8"), ("ptq-mse-fp8", "fp8"),
        ("qat-fp8", "fp8"), ("qat-fp8-fp16", "fp8-fp16"), ("ptq-max-int4", "int4")]
    assert [run_format(v.name) for v in variants[2:]] == ["int8"] * 3 + ["fp8"] * 4 + ["int4"]


def _model(zero_point_type: int | None, metadata: str | None = None) -> onnx.ModelProto:
    nodes, inits = [helper.make_node("Identity", ["x"], ["y"])], []
    if zero_point_type is not None:
        inits = [numpy_helper.from_array(np.float32(0.1), "s"),
                 helper.make_tensor("z", zero_point_type, [], [0])]
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("y", 1, [2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    if metadata:
        model.metadata_props.append(onnx.StringStringEntryProto(key="trtqat.variant",
                                                                value=metadata))
    return model


def test_a_files_precision_comes_from_its_metadata_or_its_quantized_types():
    assert file_precision(_model(None)) == "fp32"
    assert file_precision(_model(TensorProto.INT8)) == "int8"
    assert file_precision(_model(TensorProto.FLOAT8E4M3FN)) == "fp8"
    assert file_precision(_model(TensorProto.INT4)) == "int4"
    assert file_precision(_model(TensorProto.INT8, "fp8-fp16")) == "fp8-fp16"
    assert file_precision(_model(TensorProto.INT8, "int8+fp16")) == "int8-fp16"


def test_agreement_with_fp32_and_file_size(tmp_path):
    assert predictions(np.zeros((4, 3, 2))) is None  # not classifier outputs
    results = [VariantResult("fp32", "fp32"), VariantResult("ptq-max-fp8", "fp8"),
               VariantResult("ptq-max", "int8", status="failed"), VariantResult("x", "int8")]
    results[0].predictions = predictions(np.eye(4)[[0, 1, 2, 3]])
    results[1].predictions = predictions(np.eye(4)[[0, 1, 2, 0]])
    add_agreement(results)
    assert results[1].metrics["agree_fp32"] == pytest.approx(75.0)
    assert results[0].metrics["agree_fp32"] == pytest.approx(100.0)
    assert "agree_fp32" not in results[2].metrics and "agree_fp32" not in results[3].metrics
    assert "predictions" not in results[1].to_json()
    model = _model(TensorProto.FLOAT8E4M3FN)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(70000, np.float32), "w"))
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data",
                    size_threshold=1024)
    assert onnx_mib(path) == pytest.approx((path.stat().st_size
                                             + (tmp_path / "m.data").stat().st_size) / 2**20)
    assert onnx_mib(path) > 70000 * 4 / 2**20
    results[1].onnx_mib = 0.5
    doc = build_report(results[:2], backend="ort", providers=["CPU"], batch_sizes=[1],
                       metric="top1", dataset={}, settings={})
    table = format_table(doc)
    assert "agree fp32 %" in table and "ONNX MiB" in table and "75.00" in table
    assert "0.50" in table


def _doc(rows: dict[str, tuple[str, float]]) -> dict:
    results = [VariantResult(name, precision, metrics={"top1": top1}, latency_ms={1: 1.0},
                             throughput={1: 1.0}) for name, (precision, top1) in rows.items()]
    return build_report(results, backend="ort", providers=["CPU"], batch_sizes=[1],
                        metric="top1", dataset={}, settings={"run": "r"})


def test_the_demo_summary_has_each_formats_best_ptq_and_qat(tmp_path):
    from trtqat.stages.compare.result import CompareReport
    from trtqat.stages.demo_report import write_demo_report

    doc = _doc({"fp32": ("fp32", 98.0), "ptq-max": ("int8", 97.0), "qat-int8": ("int8", 97.5),
                "ptq-max-fp8": ("fp8", 97.9), "ptq-mse-fp8": ("fp8", 98.1),
                "qat-fp8": ("fp8", 98.0)})
    s = summary(doc)
    assert s["best_ptq"] == "ptq-max" and s["qat"] == 97.5  # INT8's, as before formats
    fp8 = s["formats"]["fp8"]
    assert fp8["best_ptq"] == "ptq-mse-fp8" and fp8["best_ptq_minus_fp32"] == pytest.approx(0.1)
    assert fp8["qat"] == 98.0 and fp8["qat_minus_best_ptq"] == pytest.approx(-0.1)
    section = DemoSection("resnet18", "resnet18", CompareReport(doc, []),
                          {"fp32": 98.0, "ptq-max": 96.0, "ptq-max-fp8": 97.0,
                           "ptq-mse-fp8": 97.5, "qat-int8": 97.0, "qat-fp8": 98.0})
    assert section.qat_starts == {"int8": "ptq-max", "fp8": "ptq-mse-fp8"}
    demo = write_demo_report([section], tmp_path)
    assert "best PTQ FP8 engine top1 (vs FP32)" in demo.glance
    assert "ptq-mse-fp8 98.10 (+0.10)" in demo.glance


def test_the_demo_takes_formats_and_refuses_unknown_ones():
    assert DemoConfig(formats="fp8,int8").formats == ("fp8", "int8")
    assert DemoConfig().formats == ("int8",)
    with pytest.raises(TrtqatError, match="--format fp9: give one or more of int8, fp8, int4"):
        DemoConfig(formats="fp9")

"""An Ultralytics classifier (issue 34) is an image classifier of the CNN family: a
``yolo11n-cls.yaml`` or a classify ``.pt`` (with ``--trust-model-file``) is told apart from
the detectors without building or unpickling it, built for the data's class count, recorded
in checkpoints by its yaml (rebuilt with neither file), and exported as Ultralytics exports
it (``images`` -> ``output0``, the probabilities); through the command line: calibrate,
export int8, build an ORT engine, compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_task_of_a_yaml_is_read_without_building_it(tmp_path: Path) -> None:
    """A bundled name's task is in its name; a file's is its last layer's."""
    from trtqat.families.ultralytics_files import ultralytics_task

    names = ["yolo11n-cls.yaml", "yolov8-cls-resnet50.yaml", "yolo11n.yaml", "yolo11n-seg.yaml",
             "yolo11n-pose.yaml", "yolo11n-obb.yaml", "yolov8n-p6.yaml"]
    assert [ultralytics_task(n) for n in names] == [
        "classify", "classify", "detect", "segment", "pose", "obb", "detect"]
    mine = tmp_path / "mine.yaml"  # not an Ultralytics name: read as yaml
    mine.write_text("nc: 5\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\n"
                    "head:\n  - [-1, 1, Classify, [nc]]\n")
    assert ultralytics_task(str(mine)) == "classify"
    mine.write_text(mine.read_text().replace("Classify", "Detect"))
    assert ultralytics_task(str(mine)) == "detect"
    assert ultralytics_task("resnet18") is None


def _save(tmp_path: Path, kind: str) -> Path:
    """An Ultralytics-style ``.pt`` (``{"model": model}``) of a 3-class model."""
    from trtqat.families.detect.ultralytics import _ultralytics

    tasks = _ultralytics()
    cls, name = {"cls": (tasks.ClassificationModel, "yolo11n-cls.yaml"),
                 "pose": (tasks.PoseModel, "yolo11n-pose.yaml")}[kind]
    path = tmp_path / f"{kind}.pt"
    torch.save({"model": cls(name, nc=3, verbose=False)}, path)
    return path


def test_classifiers_route_to_the_cnn_family_and_rebuild_from_their_record(
        tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from trtqat import families
    from trtqat.errors import TrtqatError
    from trtqat.runopts import trusting_model_files

    cls_pt, pose_pt = _save(tmp_path, "cls"), _save(tmp_path, "pose")
    assert [families.of_model(m).name for m in ("yolo11n-cls.yaml", str(cls_pt),
                                                "yolo11n-pose.yaml", str(pose_pt))] == [
        "cnn", "cnn", "detect", "detect"]
    cnn = families.get("cnn")
    with pytest.raises(TrtqatError, match="--trust-model-file"):  # never unpickled unasked
        cnn.build(str(cls_pt), 10)
    with trusting_model_files():
        model = cnn.build(str(cls_pt), 10)  # the head rebuilt for 10 classes
    assert model.model[-1].linear.out_features == 10
    from trtqat.families.cnn.ultralytics_cls import export_mode, record

    source = {**cnn.origin(str(cls_pt)), **record(model)}
    assert (source["kind"], source["yaml"]["nc"], cnn.arch(str(cls_pt))) == (
        "ultralytics", 10, "cls")
    cls_pt.unlink()  # a checkpoint rebuilds it from the yaml it records
    again = cnn.build(str(cls_pt), 10, record=source)
    again.load_state_dict(model.state_dict())
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        logits = again.eval()(x)  # what cross-entropy and top-1 take
        export_mode(again)
        probs = again(x)  # Ultralytics' output0
    assert logits.shape == (2, 10)
    torch.testing.assert_close(probs, logits.softmax(1))


@pytest.mark.slow
def test_ultralytics_classifier_through_the_command_line(tmp_path: Path) -> None:
    """calibrate (the head built for the digits' 10 classes), export int8 (lint clean,
    top-1 checked, Ultralytics' names), build an ORT engine, compare by top-1."""
    pytest.importorskip("ultralytics")
    import onnx
    from cli_run import TINY, trtqat

    from trtqat.runs.checkpoint import load_checkpoint

    runs = tmp_path / "runs"
    out = trtqat("calibrate", "--model", "yolo11n-cls.yaml", "--image-size", "64",
                 "--num-batches", "1", "--out", str(runs / "ptq"), *TINY, cwd=tmp_path)
    assert "built for the data's 10 classes" in out, out
    spec = load_checkpoint(runs / "ptq" / "best.pt")["model"]
    assert (spec["family"], spec["num_classes"], spec["source"]["kind"],
            spec["source"]["yaml"]["nc"]) == ("cnn", 10, "ultralytics", 10)
    export = tmp_path / "export"
    out = trtqat("export", "--checkpoint", str(runs / "ptq"), "--variant", "int8",
                 "--val-batches", "1", "--out", str(export), cwd=tmp_path)
    assert "FAIL" not in out, out
    assert "top-1 agreement 'output0'" in out and "0 error(s), 0 warning(s)" in out, out
    files = list(export.glob("*-int8.onnx"))
    assert len(files) == 1, files
    model = onnx.load(str(files[0]))
    assert [i.name for i in model.graph.input] == ["images"]
    assert [o.name for o in model.graph.output] == ["output0"]
    assert {p.key: p.value for p in model.metadata_props}["trtqat.family"] == "cnn"
    out = trtqat("build", "--onnx", str(files[0]), "--backend", "ort", "--out",
                 str(tmp_path / "cls.engine"), cwd=tmp_path)
    assert "built" in out, out
    trtqat("compare", "--run", str(runs), "--variants", "ptq-max", "--duration", "0.1",
           "--batch-sizes", "1", "--export-dir", str(export), "--out",
           str(tmp_path / "engines"), cwd=tmp_path)
    report = json.loads((tmp_path / "engines" / "report.json").read_text())
    assert report["metric"] == "top1"
    assert [(v["name"], v["status"]) for v in report["variants"]] == [("ptq-max", "ok")]
    assert 0.0 <= report["variants"][0]["metrics"]["top1"] <= 100.0

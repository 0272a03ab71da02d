"""Every Ultralytics task head (issue 34): segment, pose, OBB and classify models built
offline from their yaml go through ``trtqat.quantize`` + ``trtqat.export_onnx`` with
Ultralytics' own output names, a lint-clean INT8 file and a check of what each head means
(masks from coefficients x protos, keypoints, angles, top-1); the export check reads a pose
head's keypoints as keypoints, not class scores; a segmentation model through the command
line. Tiny: 64x64 images, batch 2, one calibration batch (the ONNX exports are the slow
part)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS = {  # yaml -> (output names, check labels the head's meaning adds)
    "yolo11n-seg.yaml": (["output0", "output1"], ["output 'output0' mask coefficients",
                                                  "output 'output1' masks"]),
    "yolo11n-pose.yaml": (["output0"], ["output 'output0' keypoints",
                                        "output 'output0' keypoint visibility"]),
    "yolo11n-obb.yaml": (["output0"], ["output 'output0' angles"]),
    "yolo11n-cls.yaml": (["output0"], ["top-1"]),
}


def _model(name: str) -> torch.nn.Module:
    pytest.importorskip("ultralytics")
    from trtqat.families.detect.ultralytics import _ultralytics

    tasks = _ultralytics()  # offline
    cls = {"seg": tasks.SegmentationModel, "pose": tasks.PoseModel, "obb": tasks.OBBModel,
           "cls": tasks.ClassificationModel}[name.split("-")[1].split(".")[0]]
    return cls(name, nc=3, verbose=False).eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HEADS))
def test_each_head_exports_int8_with_ultralytics_names_and_its_own_check(
        name: str, tmp_path: Path) -> None:
    import onnx

    import trtqat

    names, labels = HEADS[name]
    model = _model(name)
    batches = [torch.rand(2, 3, 64, 64)]
    trtqat.quantize(model, forward_loop=batches)
    path = tmp_path / "m-int8.onnx"
    result = trtqat.export_onnx(model, batches[0], path, validation_data=[torch.rand(2, 3, 64,
                                                                                    64)])
    assert result.passed, "\n".join(result.lines())
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["images"]
    assert [o.name for o in graph.output] == names
    checks = [c.name for c in result.checks]
    for label in labels:
        assert any(c.startswith(label) for c in checks), (label, checks)
    lint = [f for f in result.lint.findings if f.severity in ("error", "warning")]
    assert not lint, [(f.rule, f.node) for f in lint]
    if not name.endswith("-cls.yaml"):  # the task head's own final convs stay float
        on_purpose = {f.node for f in result.lint.findings if f.rule == "float-layer"}
        assert {f"model.23.cv4.{i}.2/Conv" for i in range(3)} <= on_purpose, on_purpose


def test_the_export_plan_holds_ultralytics_outputs_alone() -> None:
    """Fast form of the names check: the plan of a segmentation model built as a user
    builds it names Ultralytics' two outputs, and the head in export mode returns just
    those two tensors (not its (y, extras) tuple of internal tensors)."""
    from trtqat import families

    model = _model("yolo11n-seg.yaml")
    family = families.of_module(model)
    plan = family.module_plan(model, torch.rand(2, 3, 64, 64))
    assert (family.name, plan.input_names, plan.output_names) == (
        "detect", ["images"], ["output0", "output1"])
    with torch.no_grad():
        out = model(torch.rand(1, 3, 64, 64))
    assert [tuple(t.shape) for t in out] == [(1, 4 + 3 + 32, 84), (1, 32, 16, 16)]


def test_task_heads_keep_their_final_convs_float() -> None:
    """The float-head rule of each task head: its own final convs (cv4; a Segment head's
    protos' last conv) beside the box and class convs and the DFL; none for a classifier."""
    from trtqat.quant.plugins.ultralytics import head_float_layers

    common = {"model.23.cv2.*.2", "model.23.cv3.*.2", "model.23.dfl*"}
    assert set(head_float_layers(_model("yolo11n-seg.yaml"))) == {
        *common, "model.23.cv4.*.2", "model.23.proto.cv3*"}
    assert set(head_float_layers(_model("yolo11n-pose.yaml"))) == {*common, "model.23.cv4.*.2"}
    assert head_float_layers(_model("yolo11n-cls.yaml")) == ()


def test_task_models_are_refused_for_training_and_classifiers_by_the_detector_builder(
        ) -> None:
    """The detection data has no masks, keypoints or angles: a task model's loss is refused
    in one line; the detector builder refuses a classifier yaml (the CNN family's, see
    test_ultralytics_classifier.py)."""
    from trtqat.errors import TrtqatError
    from trtqat.families.detect.ultralytics import UltralyticsLoss, build_yolo

    with pytest.raises(TrtqatError, match="can be calibrated and exported"):
        UltralyticsLoss(_model("yolo11n-seg.yaml"))
    with pytest.raises(TrtqatError, match="Ultralytics classify model"):
        build_yolo("yolo11n-cls.yaml", 3)


def _pose_outputs(rng: np.random.Generator, shift: float = 0.0) -> np.ndarray:
    """A pose head's ``(1, 4 + 1 + 17 * 3, A)``: 12 confident anchors, then keypoints whose
    visibility channels sit near 0.5 (a class score's scale)."""
    a = 64
    out = np.zeros((1, 4 + 1 + 51, a), np.float32)
    out[0, 0:2] = rng.uniform(8, 56, (2, a))
    out[0, 2:4] = rng.uniform(4, 8, (2, a))
    out[0, 4] = np.where(np.arange(a) < 12, 0.9, 0.01)
    out[0, 5:] = rng.uniform(0, 64, (51, a))
    out[0, 7::3] = 0.5 + shift * rng.standard_normal((17, a))  # visibility
    return out


def test_pose_keypoints_are_not_read_as_class_scores() -> None:
    """Regression (issue 34): a candidate whose keypoints move a little (as INT8 moves
    them) keeps every detection; read as class scores (the head unknown), the keypoints
    change the detections' classes and scores and fail the match."""
    from trtqat.export.checks import CheckContext
    from trtqat.families.detect.export import detection_checks
    from trtqat.families.detect.heads import Head

    ref = _pose_outputs(np.random.default_rng(0))
    got = ref.copy()
    noise = np.random.default_rng(1).standard_normal((51, ref.shape[2]))
    got[0, 5:] += np.where(np.arange(51)[:, None] % 3 == 2, 0.05, 1.0) * noise
    ctx = CheckContext(names=["output0"])
    checks = detection_checks("int8", [[ref]], [[got]], ctx, head=Head("pose", 1, (17, 3)))
    matched = next(c for c in checks if c.name == "detections 'output0'")
    assert matched.passed and "12 of 12" in matched.detail, matched.detail
    as_scores = detection_checks("int8", [[ref]], [[got]], ctx)  # every channel a class
    assert not next(c for c in as_scores if c.name == "detections 'output0'").passed
    assert [c.name for c in checks if "keypoint" in c.name] == [
        "output 'output0' keypoints vs PyTorch fake-quant",
        "output 'output0' keypoint visibility vs PyTorch fake-quant"]


def test_segment_masks_are_checked_from_coefficients_and_protos() -> None:
    """The masks check builds sigmoid(coefficients x protos) on each side: protos that
    differ (sign flipped) fail it while the protos' own values keep their scale."""
    from trtqat.export.checks import CheckContext
    from trtqat.families.detect.export import detection_checks
    from trtqat.families.detect.heads import Head

    rng = np.random.default_rng(0)
    out0 = np.concatenate([_pose_outputs(rng)[:, :5], rng.standard_normal((1, 4, 64))], 1)
    protos = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    ctx = CheckContext(names=["output0", "output1"])
    head = Head("segment", 1)
    same = detection_checks("fp32", [[out0, protos]], [[out0, protos]], ctx, head=head)
    assert all(c.passed for c in same), [(c.name, c.detail) for c in same]
    bad = detection_checks("fp32", [[out0, protos]], [[out0, -protos]], ctx, head=head)
    masks = next(c for c in bad if c.name.startswith("output 'output1' masks"))
    assert not masks.passed, masks.detail


@pytest.mark.slow
def test_segmentation_model_through_the_command_line(tmp_path: Path) -> None:
    """``trtqat calibrate --model yolo11n-seg.yaml`` then ``trtqat export --variant int8``:
    mAP of its boxes, a lint-clean file with ``output0``/``output1``."""
    pytest.importorskip("ultralytics")
    import onnx
    from cli_run import TINY, trtqat

    runs = tmp_path / "runs"
    trtqat("calibrate", "--model", "yolo11n-seg.yaml", "--image-size", "64", "--num-batches",
           "1", "--out", str(runs / "ptq"), *TINY, cwd=tmp_path)
    out = trtqat("export", "--checkpoint", str(runs / "ptq"), "--variant", "int8",
                 "--val-batches", "1", "--out", str(tmp_path / "export"), cwd=tmp_path)
    assert "TensorRT Q/DQ lint: 0 error(s), 0 warning(s)" in out, out
    assert "output 'output1' masks" in out, out
    files = list((tmp_path / "export").glob("*-int8.onnx"))
    assert len(files) == 1, files
    graph = onnx.load(str(files[0])).graph
    assert [o.name for o in graph.output] == ["output0", "output1"]


def test_task_heads_record_their_layout_and_are_scored_by_their_boxes() -> None:
    """A pose file records its head, class count and keypoint shape (what the engine
    builders' detection check splits the channels by); the checkpoint's yaml gives the same
    head; compare's mAP of a pose output reads its box and class channels alone (box mAP),
    not its keypoints as 51 more classes."""
    from trtqat import families
    from trtqat.families.detect.heads import head_of, head_of_record

    model = _model("yolo11n-pose.yaml")
    family = families.of_module(model)
    plan = family.module_plan(model, torch.rand(2, 3, 64, 64))
    meta = {k: v for k, v in plan.metadata.items() if k != "trtqat.skip_layers"}
    assert meta == {"trtqat.head": "pose", "trtqat.classes": "3", "trtqat.keypoints": "17,3"}
    head = head_of(model)
    assert head_of_record({"yaml": model.yaml}, 3) == head
    out = _pose_outputs(np.random.default_rng(0))  # one class, 12 confident anchors
    x1, y1 = out[0, 0, :12] - out[0, 2, :12] / 2, out[0, 1, :12] - out[0, 3, :12] / 2
    target = np.stack([np.zeros(12), x1, y1, x1 + out[0, 2, :12], y1 + out[0, 3, :12]], 1)
    targets = np.empty(1, dtype=object)
    targets[0] = target
    boxes = family.metric(out, targets, head=head_of_record({"yaml": model.yaml}, 1))
    assert boxes["map50"] == pytest.approx(100.0)
    assert family.metric(out, targets)["map50"] < 50.0  # keypoints read as class scores


def test_compare_reads_the_head_of_an_explicit_onnx_file(tmp_path: Path) -> None:
    """``trtqat compare --onnx pose.onnx`` (no checkpoint): the head and class count come
    from the file's metadata; a file without them is a plain detector's."""
    import onnx
    from onnx import TensorProto, helper

    from trtqat.families.detect.compare_data import _head
    from trtqat.families.detect.heads import Head
    from trtqat.families.types import Variant

    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 56, 8])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 56, 8])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["images"], ["output0"])], "g", [x], [y]))
    path = tmp_path / "plain.onnx"
    onnx.save(model, str(path))
    variant = Variant("pose", "int8", None, onnx=path)
    assert _head([variant]) == Head()
    for key, value in (("trtqat.head", "pose"), ("trtqat.classes", "1"),
                       ("trtqat.keypoints", "17,3")):
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    onnx.save(model, str(path))
    assert _head([variant]) == Head("pose", 1, (17, 3))

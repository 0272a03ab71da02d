"""The engine builders' detection check of Ultralytics task heads (issue 34): only the
class channels of a segment, pose or OBB head's ``output0`` are read as class scores (the
head and class count come from the file's metadata); the task's own channels (mask
coefficients, keypoints, angles) are compared as what they are. Synthetic outputs: the
extras sit above the class scores' scale, so reading them as scores counts every anchor
as confident and flips classes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtqat.engines.detect_agreement import Layout, agreement, layout_of

A = 64          # anchors
CONFIDENT = 12  # the first anchors score 0.9 on class 0


def _output(extras: np.ndarray, classes: int = 2) -> np.ndarray:
    """``(1, 4 + classes + len(extras), A)``: boxes 20-30 px, confident anchors, extras."""
    rng = np.random.default_rng(0)
    out = np.zeros((1, 4 + classes + len(extras), A), np.float32)
    out[0, 0:2] = rng.uniform(16, 48, (2, A))
    out[0, 2:4] = rng.uniform(20, 30, (2, A))
    out[0, 4] = np.where(np.arange(A) < CONFIDENT, 0.9, 0.01)
    out[0, 5:4 + classes] = 0.02
    out[0, 4 + classes:] = extras
    return out


def _pose() -> np.ndarray:
    rng = np.random.default_rng(1)
    kpts = rng.uniform(0, 64, (17, 3, A))
    kpts[:, 2] = rng.uniform(0.4, 0.9, (17, A))  # visibility
    return _output(kpts.reshape(51, A))


HEADS = {  # head -> (reference, a candidate close to it, one whose extras moved)
    "pose": (Layout("pose", 2, (17, 3)), 0.3, 12.0),
    "segment": (Layout("segment", 2), 0.03, -2.0),
    "obb": (Layout("obb", 2), 0.02, 0.5),
}


def _pair(head: str, how: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    if head == "pose":
        ref = _pose()
        cand = ref.copy()
        xy = (np.arange(51) % 3 < 2)[:, None]
        cand[0, 6:] += np.where(xy, how * rng.standard_normal((51, A)), 0.0)
    elif head == "segment":
        ref = _output(rng.standard_normal((32, A)) * 2)
        cand = ref.copy()
        cand[0, 6:] = ref[0, 6:] * how if how < 0 else ref[0, 6:] + how * np.abs(
            ref[0, 6:]).mean() * rng.standard_normal((32, A))
    else:
        ref = _output(rng.uniform(0.6, 1.5, (1, A)))
        cand = ref.copy()
        cand[0, 6] += how
    return ref, cand.astype(np.float32)


@pytest.mark.parametrize("head", list(HEADS))
def test_extras_are_compared_as_what_they_are_not_as_class_scores(head: str) -> None:
    layout, close, moved = HEADS[head]
    ref, cand = _pair(head, close)
    assert agreement(ref, cand, layout) == (CONFIDENT, CONFIDENT)
    ref, cand = _pair(head, moved)
    assert agreement(ref, cand, layout) == (0, CONFIDENT)  # classes and boxes the same
    assert agreement(ref, ref, Layout(head)) == (CONFIDENT, CONFIDENT)  # class count unknown


def test_obb_angles_compare_modulo_pi() -> None:
    ref = _output(np.full((1, A), -0.78, np.float32))
    cand = ref.copy()
    cand[0, 6] = -0.78 + np.pi  # the same box turned half a turn
    assert agreement(ref, cand, Layout("obb", 2)) == (CONFIDENT, CONFIDENT)
    cand[0, 6] = np.nan  # a non-finite angle agrees with nothing
    assert agreement(ref, cand, Layout("obb", 2)) == (0, CONFIDENT)


def _identity_model(channels: int, meta: dict[str, str], delta: np.ndarray | None = None
                    ) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, channels, A])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, channels, A])
    if delta is None:
        nodes, inits = [helper.make_node("Identity", ["images"], ["output0"])], []
    else:
        inits = [onnx.numpy_helper.from_array(delta.astype(np.float32), "delta")]
        nodes = [helper.make_node("Add", ["images", "delta"], ["output0"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in meta.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    return model


def test_the_build_check_of_a_pose_file_reads_its_metadata() -> None:
    """Regression: keypoints that move by a fraction of a pixel (as INT8 moves them) kept
    the engine build from passing, read as 51 more class scores; the file's metadata now
    says which channels are scores, and a keypoint that moves by half a box still fails."""
    from trtqat.engines.ort_inspect import AgreementError, check_agreement

    ref = _pose()
    meta = {"trtqat.task": "detection", "trtqat.head": "pose", "trtqat.classes": "2",
            "trtqat.keypoints": "17,3"}
    assert layout_of(_identity_model(57, meta)) == Layout("pose", 2, (17, 3))
    # keypoint x channels nudged so that, read as scores, the best "class" changes
    delta = np.zeros_like(ref)
    top = np.sort(ref[0, 4:], 0)
    best = ref[0, 4:].argmax(0)  # a keypoint's x or y: pixels are above any score
    assert (best >= 2).all()
    delta[0, 4 + best, np.arange(A)] = -(top[-1] - top[-2] + 0.5)  # a few pixels
    feeds = [{"images": ref}]
    result = check_agreement(_identity_model(57, meta), _identity_model(57, meta, delta), feeds,
                             threads=1)
    assert (result["metric"], result["top1_agreement"], result["decisive"]) == (
        "detection", 1.0, CONFIDENT)
    plain = {"trtqat.task": "detection"}  # today's reading: every channel a class score
    with pytest.raises(AgreementError):
        check_agreement(_identity_model(57, plain), _identity_model(57, plain, delta), feeds,
                        threads=1)
    far = np.zeros_like(ref)
    far[0, 6::3] = 15.0  # every keypoint x by half a box
    with pytest.raises(AgreementError, match="detection agreement 0.00%"):
        check_agreement(_identity_model(57, meta), _identity_model(57, meta, far), feeds,
                        threads=1)

"""The detection family: model routing, data, the mAP metric, the loss, placement defaults,
the per-slice export check and the NMS companion file (fast unit tests; the CLI runs are
in test_detect_cli.py)."""

from __future__ import annotations

import json
import types

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from trtqat import families
from trtqat.export.checks import CheckContext
from trtqat.families.detect import data as D
from trtqat.families.detect.digits import DigitsDetection
from trtqat.families.detect.export import detection_checks
from trtqat.families.detect.loss import DetectionLoss
from trtqat.families.detect.metrics import coco_map, postprocess
from trtqat.families.detect.nms import OUTPUT, add_nms
from trtqat.families.detect.yolo import LEGACY_ACT, LEGACY_WIDTHS, YoloDigits
from trtqat.quant.model_ops import quantizers

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("model,family", [
    ("yolo_digits", "detect"), ("detect", "detect"), ("detect:my_det.py:make", "detect"),
    ("yolov8n.yaml", "detect"), ("yolo11n.yaml", "detect"), ("resnet18", "cnn"),
    ("my_net.py:make", "cnn"), ("minilm", "encoder"), ("yolo11n-cls.yaml", "cnn")])
def test_models_route_to_their_family(model: str, family: str) -> None:
    assert families.of_model(model).name == family


def test_digits_canvases_are_deterministic_and_boxed() -> None:
    ds = DigitsDetection("val", 64, count=8)
    for i in range(8):
        x, t = ds[i]
        x2, t2 = DigitsDetection("val", 64, count=8)[i]
        assert torch.equal(x, x2) and torch.equal(t, t2)
        assert x.shape == (3, 64, 64) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        assert 1 <= len(t) <= 4
        assert (t[:, 1:] >= 0).all() and (t[:, 1:] <= 64).all()
        assert (t[:, 3] > t[:, 1]).all() and (t[:, 4] > t[:, 2]).all()
        # the box is tight: the digit's colour fills its border rows/columns somewhere
        c, x1, y1, x2_, y2 = t[0].tolist()
        assert 0 <= c <= 9
    train, val = DigitsDetection("train", 64), DigitsDetection("val", 64)
    assert not torch.equal(train[0][0], val[0][0])
    pool_t, pool_v = train.pool[0], val.pool[0]
    assert not any((pool_v[0] == p).all() for p in pool_t[:200])  # held-out digits


def _image(path, w: int, h: int) -> None:
    from PIL import Image

    Image.fromarray(np.full((h, w, 3), 128, np.uint8)).save(path)


def test_coco_and_yolo_folders(tmp_path) -> None:
    coco = tmp_path / "coco"
    coco.mkdir()
    for i in range(3):
        _image(coco / f"{i}.png", 40, 20)
    (coco / "annotations.json").write_text(json.dumps({
        "images": [{"id": i + 7, "file_name": f"{i}.png"} for i in range(3)],
        "annotations": [{"id": 1, "image_id": 7, "category_id": 5, "bbox": [4, 2, 10, 6]},
                        {"id": 2, "image_id": 8, "category_id": 9, "bbox": [0, 0, 40, 20]}],
        "categories": [{"id": 9, "name": "b"}, {"id": 5, "name": "a"}]}))
    train, val, classes = D.datasets(str(coco), 80)
    assert classes == ["a", "b"] and len(train) + len(val) == 3
    records = train.dataset.records
    t = records[0][1]
    assert t.tolist() == [[0.0, 4.0, 2.0, 14.0, 8.0]]
    x, scaled = train.dataset[0]
    assert x.shape == (3, 80, 80)
    assert scaled.tolist() == [[0.0, 8.0, 8.0, 28.0, 32.0]]  # x * 2, y * 4

    yolo = tmp_path / "yolo"
    for split in ("train", "val"):
        (yolo / split / "images").mkdir(parents=True)
        (yolo / split / "labels").mkdir(parents=True)
        _image(yolo / split / "images" / "a.jpg", 100, 50)
        (yolo / split / "labels" / "a.txt").write_text("2 0.5 0.5 0.2 0.4\n")
    train, val, classes = D.datasets(str(yolo), 50)
    assert classes == ["0", "1", "2"]
    _, t = val[0]
    assert np.allclose(t.numpy(), [[2, 20, 15, 30, 35]])  # 100x50 -> 50x50
    (yolo / "train" / "labels" / "a.txt").write_text("2 0.5 oops\n")
    with pytest.raises(D.DetectionDataError, match="a.txt:1"):
        D.datasets(str(yolo), 50)
    with pytest.raises(D.DetectionDataError, match="not a detection folder"):
        D.datasets(str(tmp_path), 50)


def _raw(boxes_xyxy: list, classes: list, n_cls: int = 3, anchors: int = 6) -> np.ndarray:
    """A (1, 4 + C, A) head output holding ``boxes`` with score 0.9, the rest empty."""
    out = np.zeros((1, 4 + n_cls, anchors), np.float32)
    out[0, 2:4] = 1.0
    for a, (b, c) in enumerate(zip(boxes_xyxy, classes)):
        x1, y1, x2, y2 = b
        out[0, :4, a] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
        out[0, 4 + c, a] = 0.9
    return out


def test_map_is_cocos() -> None:
    targets = [np.array([[0, 10, 10, 30, 30], [2, 40, 40, 60, 70]], np.float32)]
    perfect = postprocess(_raw([[10, 10, 30, 30], [40, 40, 60, 70]], [0, 2]))
    assert coco_map(perfect, targets)["map"] == pytest.approx(100.0)
    shifted = postprocess(_raw([[14, 14, 34, 34], [40, 40, 60, 70]], [0, 2]))
    m = coco_map(shifted, targets)
    assert 40.0 < m["map"] < 100.0 and m["map50"] == pytest.approx(50.0)  # IoU 0.47 misses
    wrong_class = postprocess(_raw([[10, 10, 30, 30], [40, 40, 60, 70]], [1, 1]))
    assert coco_map(wrong_class, targets)["map"] == 0.0
    assert coco_map([np.zeros((0, 6))], targets)["map"] == 0.0


def test_loss_trains_the_builtin_detector() -> None:
    model = YoloDigits(10, widths=(8, 16, 16, 16))
    ds = DigitsDetection("train", 64, count=4)
    x, targets = D.collate([ds[i] for i in range(4)])
    crit = DetectionLoss(model.strides, 10)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for _ in range(15):
        loss = crit(model(x), targets, (64, 64))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.isfinite(losses).all() and losses[-1] < 0.6 * losses[0]
    model.eval()
    out = model(x)
    assert out.shape == (4, 14, 8 * 8 + 4 * 4 + 2 * 2)
    assert (out[:, 4:] >= 0).all() and (out[:, 4:] <= 1).all() and (out[:, 2:4] > 0).all()


def test_head_prediction_convs_stay_float() -> None:
    family = families.get("detect")
    model = family.quantize(YoloDigits(10, widths=(8, 16, 16, 16)))
    off = {n.rsplit(".", 1)[0] for n, q in quantizers(model) if q.disabled}
    on = {n.rsplit(".", 1)[0] for n, q in quantizers(model) if not q.disabled}
    assert off == {f"head.{k}.{i}" for k in ("box", "cls") for i in range(3)}
    assert "head.box_stem.0.0.conv" in on and "stem.conv" in on


def _context(names: list[str]) -> CheckContext:
    return CheckContext(names=names)


def test_export_check_scales_boxes_and_scores_apart() -> None:
    rng = np.random.default_rng(0)
    ref = np.concatenate([rng.uniform(0, 320, (2, 4, 50)), rng.uniform(0, 1, (2, 3, 50))],
                         1).astype(np.float32)
    ok = detection_checks("int8", [[ref]], [[ref + 1e-4]], _context(["output0"]))
    assert all(c.passed for c in ok), [c.line() for c in ok]
    moved = ref.copy()
    moved[:, 4:] = np.clip(moved[:, 4:] + 0.05, 0, 1)  # 6 score steps: far beyond rounding
    bad = detection_checks("int8", [[ref]], [[moved]], _context(["output0"]))
    failed = [c.name for c in bad if not c.passed]
    assert failed == ["output 'output0' scores vs PyTorch fake-quant"], failed
    # one step for the whole output (320 / 127 = 2.5) would have called this rounding
    assert float(np.abs(moved - ref).mean()) < 320 / 127
    boxes = ref.copy()
    boxes[:, :4] += 4.0  # 4 px
    assert not detection_checks("fp32", [[ref]], [[boxes]], _context(["output0"]))[0].passed


def test_nms_file_matches_trtqats_postprocessing() -> None:
    import onnxruntime as ort

    raw = np.concatenate([_raw([[10, 10, 30, 30], [11, 11, 31, 31], [40, 40, 60, 70]],
                               [0, 0, 2]), _raw([[5, 5, 9, 9]], [1])], 0)
    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["output0"])], "g",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                             ["b", 7, 6])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                                                             ["b", 7, 6])])
    model = add_nms(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                    "output0")
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    dets = sess.run([OUTPUT], {"images": raw})[0]
    assert dets.shape == (3, 7)  # the overlapping box of class 0 is suppressed
    ref = postprocess(raw, conf=0.25, iou=0.6)
    assert sorted(map(tuple, dets[:, 1:].round(3))) == sorted(
        tuple(r) for i in range(2) for r in ref[i].round(3))
    assert sorted(dets[:, 0].tolist()) == [0.0, 0.0, 1.0]


def test_classifier_options_refused_for_detect_only_features() -> None:
    from trtqat.runopts import ConfigError

    with pytest.raises(ConfigError, match="--distill is for detectors"):
        families.get("cnn").run_qat(types.SimpleNamespace(distill=1.0), {})


def test_reencoding_agreement_of_detectors_is_per_confident_anchor() -> None:
    from trtqat.engines.detect_agreement import agreement

    ref = _raw([[10, 10, 30, 30], [40, 40, 60, 70]], [0, 2])
    assert agreement(ref, ref.copy()) == (2, 2)
    moved = ref.copy()
    moved[0, 0, 1] += 0.5  # half a pixel: the same detection
    assert agreement(ref, moved) == (2, 2)
    moved[0, 0, 0] += 8.0  # 8 px on a 20 px box: IoU < 0.8
    moved[0, 4 + 1, 1] = 0.95  # another class wins
    assert agreement(ref, moved) == (0, 2)


def test_a_model_built_under_initialize_keeps_its_head_float() -> None:
    from trtqat.quant import quant_modules

    with quant_modules.initialized():
        model = YoloDigits(10, widths=(8, 16, 16, 16))
    assert not any(q.disabled for _, q in quantizers(model))  # initialize() quantized the head
    families.get("detect").quantize(model)
    off = {n.rsplit(".", 1)[0] for n, q in quantizers(model) if q.disabled}
    assert off == {f"head.{k}.{i}" for k in ("box", "cls") for i in range(3)}


def _names(model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """Enabled and disabled quantizers, each name of a shared one."""
    from trtqat.quant.tensor_quantizer import TensorQuantizer

    every = [(n, q) for n, q in model.named_modules(remove_duplicate=False)
             if isinstance(q, TensorQuantizer)]
    return {n for n, q in every if not q.disabled}, {n for n, q in every if q.disabled}


def test_builtin_detector_gets_the_graph_placement_of_trtqat_quantize() -> None:
    import trtqat

    torch.manual_seed(0)
    model = YoloDigits(10, widths=(8, 16, 16, 16))
    families.get("detect").quantize(model)
    on, off = _names(model)
    assert {f"{s}.1.m.0.residual_quantizer" for s in ("stage1", "stage2", "stage3", "stage4")
            } <= on  # the bottlenecks' residual Adds
    c2f = model.stage1[1]  # the identity is a half of cv1's output, which the concat reads
    assert c2f.m[0].residual_quantizer is c2f.concat_quantizer is c2f.cv2.conv._input_quantizer
    assert "stage4.2.pool_quantizer" in on  # SPPF: MaxPool input and output, one scale
    assert model.stage4[2].pool_quantizer is model.stage4[2].cv2.conv._input_quantizer
    # the FPN concat of the upsampled P5 and P4 (in the model's own forward) shares the
    # scale of the C2f that reads it
    assert model.concat_quantizer is model.top4.cv1.conv._input_quantizer
    assert off == {f"head.{k}.{i}.{w}_quantizer" for k in ("box", "cls") for i in range(3)
                   for w in ("_input", "_weight")}
    same = YoloDigits(10, widths=(8, 16, 16, 16))
    trtqat.quantize(same)  # the library call: the same quantizers, the head float too
    assert _names(same) == (on, off)


def test_old_detector_checkpoints_load_with_the_placement_they_were_made_with() -> None:
    from trtqat.families.cnn.models import QUANT_DESC_INPUT
    from trtqat.quant.config import QuantConfig
    from trtqat.quant.model_ops import disable_layers, quantize

    family = families.get("detect")
    # quantized as the family did before the placement (or the model's shape) was recorded
    old = YoloDigits(10, LEGACY_WIDTHS, LEGACY_ACT)
    quantize(old, QuantConfig(quant_desc_input=QUANT_DESC_INPUT))
    disable_layers(old, ("head.box.*", "head.cls.*"))
    spec = {"arch": "yolo_digits", "family": "detect", "num_classes": 10, "quantized": True,
            "skip_layers": [], "source": {"model": "yolo_digits", "kind": "builtin"}}
    loaded = family.load({"model": spec, "state_dict": old.state_dict()})
    assert _names(loaded) == _names(old)
    assert not any(n.endswith(("concat_quantizer", "residual_quantizer"))
                   for n in _names(loaded)[0])
    new = family.load({"model": {**spec, "placement": "graph-1"},
                       "state_dict": _placed_state()})
    assert any(n.endswith("residual_quantizer") for n in _names(new)[0])
    assert new.stage4[2].pool_quantizer_1.amax is not None


def _placed_state() -> dict:
    """A calibrated placed detector's state: shared quantizers under numbered names
    (``stage4.2.pool_quantizer_1``), each with its amax."""
    from trtqat.quant.model_ops import collect_stats, compute_amax

    model = YoloDigits(10, LEGACY_WIDTHS, LEGACY_ACT)
    families.get("detect").quantize(model)
    collect_stats(model, [torch.rand(1, 3, 64, 64)], progress=False)
    compute_amax(model, "max")
    state = model.state_dict()
    assert "stage4.2.pool_quantizer_1._amax" in state
    return state


def test_builtin_detector_records_its_shape_and_old_checkpoints_keep_theirs() -> None:
    from trtqat.families.detect.sources import DetectorSourceError

    family = families.get("detect")
    source = family.origin("yolo_digits")  # written into every new checkpoint's spec
    assert (source["widths"], source["act"]) == ([32, 48, 64, 96], "relu")
    spec = {"arch": "yolo_digits", "family": "detect", "num_classes": 10,
            "quantized": False, "skip_layers": []}
    old = YoloDigits(10, LEGACY_WIDTHS, "silu").eval()  # the earlier built-in detector
    x = torch.rand(1, 3, 64, 64)
    for recorded in ({"model": "yolo_digits", "kind": "builtin"}, None):  # nothing recorded
        ckpt = {"model": {**spec, **({"source": recorded} if recorded else {})},
                "state_dict": old.state_dict()}
        loaded = family.load(ckpt).eval()
        assert isinstance(loaded.stem.act, torch.nn.SiLU)
        assert torch.equal(loaded(x), old(x))
    fresh = family.build("yolo_digits", 10)
    assert (fresh.widths, fresh.act) == ((32, 48, 64, 96), "relu")
    assert isinstance(fresh.head.cls_stem[2][1].act, torch.nn.ReLU)
    new = family.load({"model": {**spec, "source": source}, "state_dict": fresh.state_dict()})
    assert (new.widths, new.act) == (fresh.widths, fresh.act)
    for bad, match in (({"widths": "wide"}, "widths 'wide'"), ({"act": "gelu"}, "'gelu'")):
        with pytest.raises(DetectorSourceError, match=match):
            family.load({"model": {**spec, "source": {**source, **bad}},
                         "state_dict": fresh.state_dict()})
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        YoloDigits(10, act="gelu")

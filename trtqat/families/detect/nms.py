"""``--nms``: a detector file with box decoding and the standard ONNX ``NonMaxSuppression``.

The companion ``<name>-nms.onnx`` keeps the raw ``output0`` and adds ``detections``
``(N, 7)``: batch index, x1, y1, x2, y2 (pixels), score, class of every box NMS keeps (per
image and class, score >= :data:`SCORE`, IoU <= :data:`IOU`, at most :data:`MAX_PER_CLASS`).
ONNX Runtime runs it; TensorRT's ONNX parser maps NonMaxSuppression to its NMS layer. It is
checked against trtqat's own post-processing (torchvision's NMS) of the same raw outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCORE = 0.25
IOU = 0.6
MAX_PER_CLASS = 100
OUTPUT = "detections"


def add_nms(model: onnx.ModelProto, raw: str, score: float = SCORE, iou: float = IOU,
            max_per_class: int = MAX_PER_CLASS) -> onnx.ModelProto:
    """A copy of ``model`` whose head output ``raw`` ``(B, 4 + C, A)`` (cx, cy, w, h,
    scores) also feeds NMS; adds the output :data:`OUTPUT`."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = {"nms_starts0": [0], "nms_ends4": [4], "nms_starts4": [4],
              "nms_end_max": [np.iinfo(np.int64).max], "nms_axis1": [1],
              "nms_idx0": [0], "nms_idx1": [1], "nms_idx2": [2], "nms_max": [max_per_class],
              "nms_ends2": [2]}
    for name, value in consts.items():
        g.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
    g.initializer.append(numpy_helper.from_array(np.asarray([iou], np.float32), "nms_iou"))
    g.initializer.append(numpy_helper.from_array(np.asarray([score], np.float32), "nms_score"))
    g.initializer.append(numpy_helper.from_array(np.asarray(0.5, np.float32), "nms_half"))
    n = helper.make_node
    kind = next(o.type.tensor_type.elem_type for o in g.output if o.name == raw)
    if kind != TensorProto.FLOAT:  # an fp16 file's output: NMS runs in float32
        g.node.append(n("Cast", [raw], ["nms_raw32"], "nms/to_float", to=TensorProto.FLOAT))
        raw = "nms_raw32"
    g.node.extend([
        n("Slice", [raw, "nms_starts0", "nms_ends4", "nms_axis1"], ["nms_cwh_t"], "nms/boxes"),
        n("Transpose", ["nms_cwh_t"], ["nms_cwh"], "nms/boxes_t", perm=[0, 2, 1]),
        n("Slice", [raw, "nms_starts4", "nms_end_max", "nms_axis1"], ["nms_scores"],
          "nms/scores"),
        n("NonMaxSuppression", ["nms_cwh", "nms_scores", "nms_max", "nms_iou", "nms_score"],
          ["nms_selected"], "nms/NonMaxSuppression", center_point_box=1),
        n("Gather", ["nms_selected", "nms_idx0"], ["nms_b"], "nms/batch", axis=1),
        n("Gather", ["nms_selected", "nms_idx1"], ["nms_c"], "nms/class", axis=1),
        n("Gather", ["nms_selected", "nms_idx2"], ["nms_a"], "nms/anchor", axis=1),
        n("Concat", ["nms_b", "nms_a"], ["nms_ba"], "nms/batch_anchor", axis=1),
        n("GatherND", ["nms_cwh", "nms_ba"], ["nms_box"], "nms/box"),
        n("GatherND", ["nms_scores", "nms_selected"], ["nms_s1"], "nms/score"),
        n("Unsqueeze", ["nms_s1", "nms_axis1"], ["nms_s"], "nms/score_col"),
        n("Slice", ["nms_box", "nms_starts0", "nms_ends2", "nms_axis1"], ["nms_xy"], "nms/xy"),
        n("Slice", ["nms_box", "nms_ends2", "nms_ends4", "nms_axis1"], ["nms_wh"], "nms/wh"),
        n("Mul", ["nms_wh", "nms_half"], ["nms_half_wh"], "nms/half"),
        n("Sub", ["nms_xy", "nms_half_wh"], ["nms_x1y1"], "nms/x1y1"),
        n("Add", ["nms_xy", "nms_half_wh"], ["nms_x2y2"], "nms/x2y2"),
        n("Cast", ["nms_b"], ["nms_bf"], "nms/batch_f", to=TensorProto.FLOAT),
        n("Cast", ["nms_c"], ["nms_cf"], "nms/class_f", to=TensorProto.FLOAT),
        n("Concat", ["nms_bf", "nms_x1y1", "nms_x2y2", "nms_s", "nms_cf"], [OUTPUT],
          "nms/detections", axis=1),
    ])
    g.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["kept", 7]))
    for key, value in (("trtqat.nms", f"score>={score},iou<={iou},per_class<={max_per_class}"),):
        out.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    return out


def _reference(raw: np.ndarray) -> list[np.ndarray]:
    """trtqat's post-processing of ``raw`` at the NMS file's thresholds: ``(n, 6)`` per
    image (x1, y1, x2, y2, score, class)."""
    from trtqat.families.detect.metrics import postprocess

    return postprocess(raw, conf=SCORE, iou=IOU, max_det=10 ** 6)


def _same(dets: np.ndarray, refs: list[np.ndarray]) -> tuple[bool, str]:
    for i, ref in enumerate(refs):
        mine = dets[dets[:, 0] == i][:, 1:]
        if len(mine) != len(ref):
            return False, f"image {i}: {len(mine)} boxes kept by NonMaxSuppression, {len(ref)} " \
                          "by trtqat's post-processing"
        key = np.lexsort((-mine[:, 4], mine[:, 5]))
        rkey = np.lexsort((-ref[:, 4], ref[:, 5]))
        if not np.allclose(mine[key], ref[rkey], atol=1e-3):
            return False, f"image {i}: the kept boxes differ"
    return True, f"{len(dets)} boxes on {len(refs)} image(s), as trtqat's post-processing keeps"


def nms_companion(path: Path, plan: Any, images: list) -> list[str]:
    """Write ``<path stem>-nms.onnx`` beside the checked ``path``; returns the lines to
    print (its check and where it went)."""
    import torch

    from trtqat.export import validate as val
    from trtqat.export.result import ExportResult, write_checked
    from trtqat.variants import variant as variant_row

    model = onnx.load(str(path))
    raw = model.graph.output[0].name
    target = path.with_name(f"{path.stem}-nms.onnx")
    variant = next((p.value for p in model.metadata_props if p.key == "trtqat.variant"), "fp32")
    nms_model = add_nms(model, raw)
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    result = ExportResult(target, variant, opset, plan.dynamic_batch)

    def check(tmp: str) -> None:
        session = val.ort_session(tmp)
        ok, detail = True, ""
        for x in images:
            x = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
            feed = {session.get_inputs()[0].name: x.numpy().astype(
                np.float16 if variant_row(variant).fp16 and "float16" in
                session.get_inputs()[0].type else np.float32)}
            outs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
            ok, detail = _same(np.asarray(outs[OUTPUT], np.float32),
                               _reference(np.asarray(outs[raw], np.float32)))
            if not ok:
                break
        result.checks.append(val.Check(f"output '{OUTPUT}' (NonMaxSuppression)", ok, detail))

    write_checked(nms_model, result, check)
    return [*(f"  {line}" for line in result.lines()), f"  -> {target}"]

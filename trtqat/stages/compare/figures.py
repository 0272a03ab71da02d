"""Two figures of a comparison beside accuracy and speed: top-1 agreement with the FP32
engine (the same images, prediction by prediction) and the ONNX file's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def predictions(outputs: np.ndarray) -> np.ndarray | None:
    """Each row's top-1 class for classifier outputs ``(N, classes)``; None for any other
    output (embeddings, detections), which has no agreement figure."""
    if outputs.ndim != 2 or outputs.shape[1] < 2:
        return None
    return outputs.argmax(axis=1)


def add_agreement(results: list[Any]) -> None:
    """``metrics["agree_fp32"]``: the % of images on which each measured variant predicts
    what the ``fp32`` variant's engine predicts (when both have classifier predictions)."""
    ref = next((r for r in results if r.name == "fp32" and r.status == "ok"
                and r.predictions is not None), None)
    if ref is None:
        return
    for r in results:
        if r.status == "ok" and r.predictions is not None and \
                r.predictions.shape == ref.predictions.shape:
            r.metrics["agree_fp32"] = float(np.mean(r.predictions == ref.predictions) * 100)


def onnx_mib(path: str | Path) -> float:
    """The size of an ONNX model in MiB: the file and the external data files it names."""
    import onnx

    path = Path(path)
    total = path.stat().st_size
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - sized as a file: the build reports what is wrong
        return total / 2**20
    places = {e.value for t in model.graph.initializer for e in t.external_data
              if e.key == "location"}
    for place in places:
        data = path.parent / place
        if data.is_file():
            total += data.stat().st_size
    return total / 2**20

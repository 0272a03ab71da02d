"""report.png stays readable when variants cluster: no label overlaps another or leaves its
panel, every variant is named in every row, one row per model."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from trtqat.stages.compare.plot import build_figure, plot_reports  # noqa: E402

INT8 = ("ptq-max", "ptq-percentile-99.9", "ptq-percentile-99.99", "ptq-mse", "ptq-entropy",
        "qat-int8", "qat-int8-fp16")


def _variant(name: str, precision: str, top1: float, latency: float, throughput: float,
             **extra) -> dict:
    return {"name": name, "precision": precision, "status": "ok", "metrics": {"top1": top1},
            "latency_ms": {"1": latency, "32": latency * 10},
            "throughput": {"1": 1e3 / latency, "32": throughput},
            "rounds": {"1": {"latency_ms": [latency * 0.9, latency, latency * 1.2]},
                       "32": {"throughput": [throughput * 0.8, throughput]}}, **extra}


def _report(model: str, fp32: float, int8: float) -> dict:
    """Every INT8 variant at one latency, throughput and top-1: one point of a scatter."""
    variants = [_variant("fp32", "fp32", fp32, 1.0, 2000.0),
                _variant("fp16", "fp16", fp32, 30.0, 60.0, emulated=True)]
    variants += [_variant(n, "int8-fp16" if n.endswith("fp16") else "int8", int8, 0.3, 6000.0)
                 for n in INT8]
    variants.append({"name": "broken", "precision": "int8", "status": "failed",
                     "error": "it failed", "metrics": {}, "latency_ms": {}, "throughput": {}})
    return {"metric": "top1", "batch_sizes": [1, 32], "variants": variants,
            "backend": "ort", "machine": {"cpu": "cpu"}, "settings": {"model": model}}


def _boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        labels = [t for t in ax.texts if t.get_text()]
        ticks = [t for t in ax.get_yticklabels() if t.get_text()]
        yield ax, [(t.get_text(), t.get_window_extent(renderer)) for t in labels], \
            [t.get_text() for t in ticks], ax.get_window_extent(renderer)


def test_clustered_variants_get_separate_labels_inside_their_panel():
    sections = [("resnet18", _report("resnet18", 98.6, 98.6)),
                ("mobilenet_v2", _report("mobilenet_v2", 97.5, 96.1))]
    fig = build_figure(sections, "title")
    panels = list(_boxes(fig))
    assert len(panels) == 2 * 3  # a row per model: top-1, latency @1, throughput @32
    for _ax, labels, _ticks, frame in panels:
        assert len(labels) == 9  # every measured variant written once (not the failed one)
        for (a, box_a), (b, box_b) in itertools.combinations(labels, 2):
            assert not box_a.overlaps(box_b), (a, b)
        for text, box in labels:
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1, text  # inside its panel
    first_column = [ticks for ax, _, ticks, _ in panels if ticks]
    assert len(first_column) == 2
    for ticks in first_column:  # the names, with the failed and emulated variants marked
        assert ticks[0] == "fp32" and "fp16 (emulated)" in ticks and "broken FAILED" in ticks
        assert set(INT8) <= set(ticks)


def test_top1_labels_give_the_difference_to_fp32(tmp_path: Path):
    report = _report("mobilenet_v2", 97.5, 96.1)
    fig = build_figure([("m", report)])
    texts = [t for _, labels, _, _ in _boxes(fig) for t, _ in labels]
    assert "96.10 (-1.40)" in texts and "97.50" in texts
    assert "0.3 ms (3.33x)" in texts  # speed-up over FP32's median latency
    plot_reports([("m", report)], tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
